"""Helpers for running `unwind` as a pipeline runs it: in-process through `main`, or as a
real process (for standard input, exit codes and what reaches the terminal)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from unwind.cli.main import main

REPO = Path(__file__).resolve().parents[2]
Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working folder, with no signing or trust settings from the environment."""
    monkeypatch.chdir(tmp_path)
    for name in ("UNWIND_MANIFEST_PUBLIC_KEY", "UNWIND_SIGNING_KEY", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USER", "alice")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / ".cache"))
    return tmp_path


@pytest.fixture
def unwind(capsys: pytest.CaptureFixture[str]) -> Run:
    """`unwind ARGS...` in-process: (exit code, stdout, stderr); a usage error's exit 2 too."""
    def run(*argv: str) -> tuple[int, str, str]:
        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse: usage errors, --help, --version
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err
    return run


def run_process(*argv: str, stdin: str | None = None, cwd: Path | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`unwind ARGS...` as a separate process, this worktree's code first on the path."""
    environ = {**os.environ, "PYTHONPATH": str(REPO / "operator"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "unwind.cli.main", *argv], input=stdin,
                          capture_output=True, text=True, cwd=cwd, env=environ, timeout=60,
                          check=False)
