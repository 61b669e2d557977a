"""Runs `unwind keygen` / `unwind manifests ...` through a parser built the way the main
CLI builds it (the lead's main.py calls the same two register functions)."""

from __future__ import annotations

import argparse

import pytest

from unwind.cli.registry_cmds import register_keygen, register_manifests


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="unwind")
    sub = top.add_subparsers(dest="command", required=True)
    register_keygen(sub)
    manifests = sub.add_parser("manifests")
    register_manifests(manifests.add_subparsers(dest="manifests_command", required=True))
    return top


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    args = parser().parse_args(list(argv))
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err
