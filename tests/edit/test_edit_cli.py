"""`unwind manifests rename|remove` on the command line: where the paths come from, and
what a person sees when a tool is not there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from edit_helpers import FIXTURES, load_tree

from unwind.cli.main import main

CASE = FIXTURES / "remove_with_readers" / "before"


@pytest.fixture
def two_repos(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """The same manifests in `here` (the working folder) and in `there`."""
    here, there = tmp_path / "here", tmp_path / "there"
    shutil.copytree(CASE, here)
    shutil.copytree(CASE, there)
    monkeypatch.chdir(here)
    return here, there


def test_remove_takes_its_paths_as_positional_arguments_like_rename(
        two_repos: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    here, there = two_repos
    untouched = load_tree(here)
    assert main(["manifests", "remove", "stripe.list_charges", str(there)]) == 0
    assert "removed stripe.list_charges" in capsys.readouterr().out
    assert load_tree(here) == untouched
    assert "stripe.list_charges" not in (there / "payments.yaml").read_text()


def test_several_tools_and_several_paths_mix_in_any_order(two_repos: tuple[Path, Path]) -> None:
    here, there = two_repos
    code = main(["manifests", "remove", "stripe.list_charges", str(there / "payments.yaml"),
                 "stripe.get_charge", "stripe.create_charge", str(there / "payments.test.yaml"),
                 "stripe.refund"])
    assert code == 0
    assert "tool:" not in (there / "payments.yaml").read_text()
    assert load_tree(here) == load_tree(CASE)


def test_remove_with_the_paths_option_still_works(two_repos: tuple[Path, Path]) -> None:
    here, there = two_repos
    assert main(["manifests", "remove", "stripe.list_charges", "--paths", str(there)]) == 0
    assert "stripe.list_charges" not in (there / "payments.yaml").read_text()
    assert load_tree(here) == load_tree(CASE)


def test_rename_takes_the_paths_option_too(two_repos: tuple[Path, Path]) -> None:
    here, there = two_repos
    assert main(["manifests", "rename", "stripe.refund", "stripe.refunds.create",
                 "--paths", str(there)]) == 0
    assert "stripe.refunds.create" in (there / "payments.yaml").read_text()
    assert load_tree(here) == load_tree(CASE)


def test_removing_a_tool_no_given_file_declares_is_refused_naming_the_tool_and_the_paths(
        two_repos: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, there = two_repos
    assert main(["manifests", "remove", "stripe.nope", str(there)]) == 1
    err = capsys.readouterr().err
    assert err == f'error: not_found: no tool named "stripe.nope" in {there} (2 files read)\n'
    assert load_tree(there) == load_tree(CASE)


def test_a_missing_path_that_looks_like_one_is_read_as_a_tool_with_a_note(
        two_repos: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["manifests", "remove", "stripe.refund", "manifest/typo.yaml", "--json"]) == 1
    captured = capsys.readouterr()
    assert 'note: "manifest/typo.yaml" is not an existing file or folder' in captured.err
    errors = json.loads(captured.out)["errors"]
    assert [(e["code"], e["message"]) for e in errors] == [
        ("not_found", 'no tool named "manifest/typo.yaml" in . (2 files read)')]


def test_remove_with_only_paths_asks_for_a_tool(
        two_repos: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, there = two_repos
    assert main(["manifests", "remove", str(there)]) == 1
    assert "no tool to remove" in capsys.readouterr().err
    assert load_tree(there) == load_tree(CASE)


def test_a_dry_run_says_it_wrote_nothing_and_writes_nothing(
        two_repos: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    here, _ = two_repos
    assert main(["manifests", "remove", "--dry-run", "stripe.list_charges", "."]) == 0
    assert "(dry run: nothing written)" in capsys.readouterr().out
    assert load_tree(here) == load_tree(CASE)
