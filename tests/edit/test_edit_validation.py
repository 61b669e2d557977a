"""An edit is refused for the validation problems it adds, not for ones already there:
from a repository root the files edited hold unrelated manifests (examples, fixtures,
several namespaces) whose problems are not the edit's to fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from unwind.cli.edit_cmds import NewProblems
from unwind.cli.main import main
from unwind.manifest.loader import check_paths

ROOT = Path(__file__).resolve().parents[2]

GOOD = "- tool: a\n  effect: read_only\n  permission: p\n"
# a read_only verification tool is required: `b` breaks that rule before and after any edit
BROKEN = """\
- tool: b
  effect: compensable
  permission: p
  compensation:
    tool: c
    argument_map: {id: $result.id}
    verification: {tool: c, arguments: {id: $result.id}, expect: {ok: true}}
- tool: c
  effect: idempotent
  permission: p
"""


def test_a_problem_that_was_there_before_is_not_the_edits(tmp_path: Path) -> None:
    before = {"x.yaml": BROKEN, "y.yaml": GOOD}
    unchanged = NewProblems()
    assert unchanged(before, before) == []
    assert unchanged.kept == 1
    # renamed: the problem now quotes 'd', and is still the same problem
    after = {"x.yaml": BROKEN.replace("tool: c", "tool: d"), "y.yaml": GOOD}
    renamed = NewProblems({"c": "d"})
    assert renamed(after, before) == []
    assert renamed.kept == 1
    assert NewProblems()(after, before) != []


def test_a_problem_the_edit_adds_refuses_it() -> None:
    validator = NewProblems()
    before = {"y.yaml": GOOD}
    after = {"y.yaml": GOOD.replace("read_only", "read-only")}
    (problem,) = validator(after, before)
    assert problem.startswith("y.yaml:2: a: effect:")
    assert validator.kept == 0


def test_a_problem_that_only_moved_lines_is_the_same_problem() -> None:
    before = {"x.yaml": GOOD.replace("- tool: a", "- tool: z") + BROKEN}
    after = {"x.yaml": BROKEN}
    validator = NewProblems()
    assert validator(after, before) == []
    assert validator.kept == 1


def test_the_command_edits_beside_a_broken_manifest_and_says_the_problem_was_there(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.yaml").write_text(BROKEN)
    (tmp_path / "y.yaml").write_text(GOOD)
    monkeypatch.chdir(tmp_path)
    assert main(["manifests", "rename", "a", "e"]) == 0
    assert "tool: e" in (tmp_path / "y.yaml").read_text()
    assert "note: 1 validation problem was there before this edit" in capsys.readouterr().err
    assert main(["manifests", "rename", "e", "a", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["existing_problems"] == 1


def test_a_dry_run_rename_from_the_repository_root_succeeds_and_skips_the_chart_templates(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    tool = check_paths([ROOT / "manifests"]).manifests[0].tool
    monkeypatch.chdir(ROOT)
    tracked_before = {p: p.stat().st_mtime_ns for p in (ROOT / "manifests").iterdir()}
    code = main(["manifests", "rename", tool, f"{tool}.renamed", "--dry-run", "--json"])
    answer = json.loads(capsys.readouterr().out)
    assert code == 0, answer["errors"]
    assert any(f.startswith("manifests/") for f in answer["changes"]["files"])
    templates = {f"charts/unwind/templates/{n}" for n in os.listdir(ROOT / "charts/unwind/templates")
                 if n.endswith((".yaml", ".yml"))}
    skipped = {s["file"]: s["reason"] for s in answer["skipped"]}
    assert templates and templates <= set(skipped)
    assert not [f for f in [*skipped, *answer["changes"]["files"]] if f.startswith(".")]
    assert {p: p.stat().st_mtime_ns for p in (ROOT / "manifests").iterdir()} == tracked_before
