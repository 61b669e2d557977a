"""Issue 30.1 against a document store nobody here wrote: pouchdb-server (npm), the CouchDB
API with revisions (tests/rollback/pouchdb.py). A run that creates documents and then edits
them, and edits one that existed before, is rolled back by `unwind rollback` to exactly
the state before the run, read from the store itself: each undo names the revision read
right before it (`$current`, If-Match), so the update's undo no longer leaves the create's
undo a stale revision (409). A document changed by hand after the run is not overwritten:
its undo is refused as diverged, the rest is undone, and a person settles it.

The worked example of docs/manifests.md ("A worked example: an API with revisions") runs
here command by command, as written, with the manifests the page shows above it, and two
substitutions a reader's machine does not need: the installed server's path for `npx -y
pouchdb-server` (CI does not fetch at test time) and free ports.

When npm cannot fetch pouchdb-server the test skips saying why (under CI=true it fails).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.conftest import ROOT, GatewayProc, env, free_port, start_gateway, stop
from tests.doc_sections import blocks, run_shell, section
from tests.gateway.installs import POUCHDB_SERVER, npm_tool

from .pouchdb import AFTER_RUN, AGENT, BEFORE, MANIFESTS, PouchDB, manifests_for

WORKED = "### A worked example: an API with revisions (pouchdb-server)"


@dataclass
class Stack:
    store: PouchDB
    manifests: Path
    gateway: GatewayProc

    def agent(self) -> str:
        done = subprocess.run([sys.executable, "-c", AGENT], env={**os.environ, "UNWIND_GATEWAY": self.gateway.url},
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "DONE" in done.stdout, done.stdout + done.stderr
        return done.stdout

    def unwind(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "unwind.cli.main", *args], cwd=ROOT, env=env(),
                              capture_output=True, text=True, timeout=120)

    def rollback(self) -> subprocess.CompletedProcess[str]:
        return self.unwind("rollback", "--ledger", str(self.gateway.ledger / "run-1.json"), "-m",
                           str(self.manifests), "--yes", "--by", "sre", "--reason", "the agent misbehaved")


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    store = PouchDB("127.0.0.1", free_port(), tmp_path)
    try:
        store.reset(BEFORE)
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        (manifests / "docs.yaml").write_text(manifests_for(store.url))
        gateway = start_gateway(manifests, tmp_path / "ledger", tmp_path, "--run", "run-1",
                                scopes="docs:read,docs:write")
        try:
            yield Stack(store, manifests, gateway)
        finally:
            stop(gateway.proc)
    finally:
        store.stop()


def test_the_manifests_validate_and_lint_without_errors(tmp_path: Path) -> None:
    path = tmp_path / "docs.yaml"
    path.write_text(manifests_for("http://127.0.0.1:5984"))
    for command in (["validate", str(path)], ["lint", str(path)]):
        done = subprocess.run([sys.executable, "-m", "unwind.cli.main", *command], cwd=ROOT, env=env(),
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_run_that_creates_and_edits_documents_is_rolled_back_to_the_store_before_it(stack: Stack) -> None:
    stack.agent()
    assert stack.store.titles() == AFTER_RUN
    done = stack.rollback()
    assert done.returncode == 0, done.stdout + done.stderr
    assert stack.store.titles() == BEFORE  # read from the store: the new ones gone, kept's title back
    states = {e["id"]: e["state"] for e in stack.gateway.entries("run-1")}
    assert states == {"create-a": "undone", "create-b": "undone", "create-c": "undone", "read-kept": "succeeded",
                      "update-kept-1": "undone", "update-a-1": "undone", "update-kept-2": "undone",
                      "update-b-1": "undone", "update-a-2": "undone"}
    again = stack.rollback()  # nothing left to undo: the store is not written again
    assert again.returncode == 0, again.stdout + again.stderr
    assert stack.store.titles() == BEFORE


def test_a_document_changed_by_hand_after_the_run_is_not_overwritten_and_is_settled_by_a_person(
        stack: Stack, tmp_path: Path) -> None:
    stack.agent()
    stack.store.put("b", "fixed by hand")  # someone edits b after the agent did
    done = stack.rollback()
    assert done.returncode == 1, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "FAIL update-b-1 inverse docs.restore: diverged" in said
    assert "docs.get reads a state the call did not leave " \
           '(title is "fixed by hand", the call left "final b")' in said, said
    assert "decide by hand and record it with settle" in said
    assert stack.store.titles()["b"] == "fixed by hand"  # the hand edit is not overwritten
    states = {e["id"]: e["state"] for e in stack.gateway.entries("run-1")}
    assert states["update-b-1"] == "undo_failed" and states["create-b"] == "succeeded"
    ledger = str(stack.gateway.ledger / "run-1.json")
    for entry in ("update-b-1", "create-b"):  # b stays as fixed: a person says so, and why
        settled = stack.unwind("settle", "--ledger", ledger, entry, "--by", "olga",
                               "--reason", "b keeps the hand edit")
        assert settled.returncode == 0, settled.stdout + settled.stderr
        assert settled.stdout.startswith(f"settled entry {entry} (docs.") and \
            "of run run-1 as olga (self-declared): b keeps the hand edit" in settled.stdout
    rest = stack.rollback()  # the failed step no longer stops the rest
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert stack.store.titles() == {**BEFORE, "b": "fixed by hand"}
    states = {e["id"]: e["state"] for e in stack.gateway.entries("run-1")}
    assert states["update-b-1"] == states["create-b"] == "settled"
    assert stack.unwind("keygen", str(tmp_path / "evidence")).returncode == 0
    exported = stack.unwind("ledger", "export", ledger, "--key", str(tmp_path / "evidence.key"),
                            "--file", str(tmp_path / "run-1.evidence.json"))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    evidence = json.loads((tmp_path / "run-1.evidence.json").read_text())["evidence"]
    assert {s["entry"]: (s["by"], s["reason"]) for s in evidence["settles"]} == {
        e: ("olga", "b keeps the hand edit") for e in ("update-b-1", "create-b")}


def test_the_worked_example_creates_and_edits_a_document_and_rolls_it_back_as_written(
        tmp_path: Path) -> None:
    binary = npm_tool(*POUCHDB_SERVER)
    store, door = str(free_port()), str(free_port())

    def local(text: str) -> str:
        return (text.replace("npx -y pouchdb-server", str(binary))
                .replace("5984", store).replace("8798", door))
    (script,) = (local(b) for b in blocks(section("manifests.md", WORKED), "sh"))
    (tmp_path / "docs.yaml").write_text(local(MANIFESTS))
    out = run_shell(script, tmp_path)
    assert "ok: 5 tool manifests valid" in out
    assert out.count('"ok":true,"id":"a","rev":"1-') == 1, out  # the create
    assert out.count('"ok":true,"id":"a","rev":"2-') == 1, out  # the edit, at the revision read
    order = [line.split()[3] for line in out.splitlines() if line.startswith("ok   ")]
    assert order == ["docs.restore:", "docs.remove:"], out  # newest first, one at a time
    assert "docs.get confirmed it gone" in out and "rolled back: 2 steps ran" in out
    assert "right before the undo docs.get reads the object as it is now ($current: " \
           "headers.If-Match)" in out
    assert out.strip().splitlines()[-1].startswith('{"error":"not_found"'), out
    shown = subprocess.run([sys.executable, "-m", "unwind.cli.main", "ledger", "show", "demo",
                            "--ledger-dir", str(tmp_path / "ledger"), "-o", "json"],
                           cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    [page] = json.loads(shown.stdout)["items"]
    assert [(e["tool"], e["state"]) for e in page["status"]["entries"]] == [
        ("docs.create", "undone"), ("docs.get", "succeeded"), ("docs.update", "undone")]
