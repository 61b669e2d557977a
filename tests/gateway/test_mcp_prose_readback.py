"""Issue 30.2 against a published stdio MCP server whose tools answer prose: mcp-server-git
(PyPI, a dev dependency), on a real git repository. A capture + read-back manifest undoes
`git_add` although the call's answer ("Files staged successfully") and the read-back (the
staged diff) have nothing in common, because the divergence check compares the read made
right after the call (`verification.after_call`) with the read made before the undo; a
real later change (another file staged by hand) is still caught, and nothing is reset; a
file staged before the run makes the undo fail its read-back (git_reset unstages it too),
never report `undone`. Without `after_call` the same honest run is refused as diverged, as
the page says.

The manifests and commands are docs/manifests.md's ("A worked example: an MCP tool that
answers prose"), read from the page, with a test's own repository and port.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gateway.conftest import ROOT, GatewayProc, env, free_port, start_gateway, stop
from tests.doc_sections import blocks, reader_env, run_shell, section

SECTION = "### A worked example: an MCP tool that answers prose (mcp-server-git)"
REPO = "/tmp/unwind-repo"


def page() -> tuple[str, str]:
    """The section's manifests and its shell block."""
    text = section("manifests.md", SECTION)
    (manifests,) = blocks(text, "yaml")
    (story,) = blocks(text, "sh")
    return manifests, story


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com",
                           *args], check=True, capture_output=True, text=True).stdout


def test_the_worked_example_runs_as_written(tmp_path: Path) -> None:
    manifests, story = page()
    repo = tmp_path / "repo"
    (tmp_path / "git").mkdir()
    (tmp_path / "git" / "tools.yaml").write_text(manifests.replace(REPO, str(repo)))
    out = run_shell(story.replace(REPO, str(repo)).replace("8798", str(free_port())), tmp_path)
    assert "ok: 3 tool manifests valid" in out
    assert "rolled back: 1 step ran" in out and "read it back as expected" in out, out
    assert out.strip().splitlines()[-1] == "?? plan.md", out  # untracked again
    assert git(repo, "diff", "--cached") == ""


@dataclass
class Stack:
    repo: Path
    manifests: Path
    gateway: GatewayProc

    def stage(self, *files: str) -> dict[str, object]:
        answer = self.gateway.call("git.add", {"repo_path": str(self.repo), "files": list(files)})
        assert answer.status_code == 200, answer.text
        return dict(answer.json())

    def rollback(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "unwind.cli.main", "rollback", "--ledger",
                               str(self.gateway.ledger / "run-1.json"), "-m", str(self.manifests), "--yes"],
                              cwd=ROOT, env=reader_env(), capture_output=True, text=True, timeout=120)


def stack_for(tmp_path: Path, manifests_text: str) -> Iterator[Stack]:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "README.md").write_text("notes\n")
    git(repo, "add", "README.md")
    git(repo, "commit", "-q", "-m", "start")
    (repo / "plan.md").write_text("draft\n")
    (repo / "notes.md").write_text("more\n")
    folder = tmp_path / "git"
    folder.mkdir()
    (folder / "tools.yaml").write_text(manifests_text.replace(REPO, str(repo)))
    gw = start_gateway(folder, tmp_path / "ledger", tmp_path, "--run", "run-1",
                       scopes="git:read,git:write", env_extra=reader_env())  # mcp-server-git
    try:
        yield Stack(repo, folder, gw)
    finally:
        stop(gw.proc)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    yield from stack_for(tmp_path, page()[0])


def test_the_read_after_the_call_is_recorded_and_a_later_change_is_caught_not_reset(stack: Stack) -> None:
    answer = stack.stage("plan.md")
    assert "Files staged successfully" in json.dumps(answer)  # prose, nothing like the diff
    (entry,) = stack.gateway.entries()
    assert entry["state"] == "succeeded", entry
    git(stack.repo, "add", "notes.md")  # someone stages more after the call
    done = stack.rollback()
    assert done.returncode != 0, done.stdout + done.stderr
    assert "diverged" in done.stdout + done.stderr, done.stdout + done.stderr
    assert "notes.md" in done.stdout + done.stderr  # it says what it found
    assert git(stack.repo, "status", "--short").splitlines() == ["A  notes.md", "A  plan.md"]  # nothing reset


def test_a_file_staged_before_the_run_makes_the_undo_fail_its_read_back_not_report_undone(
        stack: Stack) -> None:
    git(stack.repo, "add", "notes.md")  # staged before the run: git_reset unstages it too
    stack.stage("plan.md")
    done = stack.rollback()
    said = done.stdout + done.stderr
    assert done.returncode != 0 and "the read-back git.diff_staged did not match" in said, said
    (entry,) = stack.gateway.entries()
    assert entry["state"] == "undo_failed", entry  # not undone: the index is not as before
    assert git(stack.repo, "status", "--short").splitlines() == ["?? notes.md", "?? plan.md"]


@pytest.fixture
def without_after_call(tmp_path: Path) -> Iterator[Stack]:
    manifests = page()[0]
    line = next(x for x in manifests.splitlines() if "after_call: true" in x)
    yield from stack_for(tmp_path, manifests.replace(line + "\n", ""))


def test_without_the_read_after_the_call_lint_warns_and_an_honest_undo_is_refused_as_diverged(
        without_after_call: Stack) -> None:
    lint = subprocess.run([sys.executable, "-m", "unwind.cli.main", "lint", str(without_after_call.manifests)],
                          cwd=ROOT, env=env(), capture_output=True, text=True, timeout=60)
    assert "L043" in lint.stdout + lint.stderr, lint.stdout + lint.stderr
    without_after_call.stage("plan.md")
    done = without_after_call.rollback()
    assert done.returncode != 0 and "diverged" in done.stdout + done.stderr, done.stdout + done.stderr
    assert git(without_after_call.repo, "status", "--short").splitlines() == ["A  plan.md", "?? notes.md"]
