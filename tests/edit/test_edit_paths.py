"""The filesystem layer: folders expand, writes are atomic, refusals and no-ops write nothing."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest
from edit_helpers import FIXTURES, after, load_tree

from unwind.edit import apply_to_paths, expand, remove, rename, revision


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "rename_across_files" / "before", root)
    (root / "notes.txt").write_text("stripe.get_charge is mentioned here\n")
    past = 1_600_000_000
    for path in root.rglob("*"):
        os.utime(path, (past, past))
    return root


def mtimes(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_mtime_ns for p in sorted(root.rglob("*"))}


def test_a_folder_expands_to_its_yaml_files_sorted(tree: Path) -> None:
    (tree / ".git").mkdir()
    (tree / ".git" / "config.yaml").write_text("x: 1\n")
    (tree / "extra.yml").write_text("a: 1\n")
    assert expand([tree]) == [
        str(tree / "extra.yml"),
        str(tree / "manifests" / "disputes.yaml"),
        str(tree / "manifests" / "payments.yaml"),
        str(tree / "tests" / "payments.test.yaml"),
    ]


def test_a_rename_on_disk_writes_the_expected_bytes_and_keeps_file_modes(tree: Path) -> None:
    target = tree / "manifests" / "disputes.yaml"
    target.chmod(0o640)
    result = apply_to_paths([tree], rename, "stripe.get_charge", "stripe.charges.get")
    assert result.success
    assert load_tree(tree) == after("rename_across_files")
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert not [p for p in tree.rglob(".unwind-edit-*")]
    assert (tree / "notes.txt").read_text() == "stripe.get_charge is mentioned here\n"


def test_a_no_op_rename_writes_nothing(tree: Path) -> None:
    before = mtimes(tree)
    result = apply_to_paths([tree], rename, "stripe.get_charge", "stripe.get_charge")
    assert result.success
    assert result.files == {}
    assert result.changes.files == []
    assert result.revision == revision(load_tree_abs(tree))
    assert mtimes(tree) == before


def test_a_rename_of_a_missing_name_writes_nothing(tree: Path) -> None:
    before = mtimes(tree)
    result = apply_to_paths([tree], rename, "stripe.nope", "stripe.other")
    assert [e.code for e in result.errors] == ["not_found"]
    assert mtimes(tree) == before


@pytest.mark.parametrize(
    "call",
    [
        lambda root: apply_to_paths([root], remove, ["stripe.get_charge"]),
        lambda root: apply_to_paths(
            [root], rename, "stripe.get_charge", "x.y", base_revision="ffffffffffff"
        ),
        lambda root: apply_to_paths(
            [root], rename, "stripe.get_charge", "x.y", validator=lambda after, before: ["no"]
        ),
    ],
    ids=["has_references", "stale", "invalid"],
)
def test_a_refused_edit_writes_nothing(tree: Path, call: object) -> None:
    before = mtimes(tree)
    texts = load_tree(tree)
    result = call(tree)  # type: ignore[operator]
    assert not result.success
    assert mtimes(tree) == before
    assert load_tree(tree) == texts


def test_a_dry_run_returns_the_new_texts_and_writes_nothing(tree: Path) -> None:
    before = mtimes(tree)
    result = apply_to_paths([tree], rename, "stripe.get_charge", "stripe.charges.get", write=False)
    assert result.success and len(result.files) == 3
    assert mtimes(tree) == before


def test_the_base_revision_is_over_the_expanded_paths(tree: Path) -> None:
    token = revision(load_tree_abs(tree))
    result = apply_to_paths([tree], remove, ["stripe.legacy_charge_lookup"], base_revision=token)
    assert result.success, result.errors


def test_crlf_line_endings_survive_a_rename(tmp_path: Path) -> None:
    path = tmp_path / "crlf.yaml"
    path.write_bytes(
        b"# payments\r\n- tool: a.read  # r\r\n  effect: read_only\r\n"
        b"- tool: a.write\r\n  effect: idempotent\r\n  requires: [a.read]\r\n"
    )
    assert apply_to_paths([path], rename, "a.read", "a.get").success
    assert path.read_bytes() == (
        b"# payments\r\n- tool: a.get  # r\r\n  effect: read_only\r\n"
        b"- tool: a.write\r\n  effect: idempotent\r\n  requires: [a.get]\r\n"
    )
    assert apply_to_paths([path], remove, ["a.write"]).success
    assert path.read_bytes() == b"# payments\r\n- tool: a.get  # r\r\n  effect: read_only\r\n"


def load_tree_abs(root: Path) -> dict[str, str]:
    return {str(root / rel): text for rel, text in load_tree(root).items()}
