"""Registry operations beyond the contract table: reading files, diff, list, records."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from unwind.registry import FolderStorage, Registry, RegistryError

REPO = Path(__file__).resolve().parents[2]
PAYMENTS = REPO / "manifests" / "payments.yaml"


def _registry(tmp_path: Path) -> Registry:
    return Registry(FolderStorage(tmp_path / "reg"),
                    clock=lambda: datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC))


def test_publishing_resource_files_overrides_their_lifecycle_with_the_status(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    outcomes = registry.publish([PAYMENTS], by="alice", note="first draft")
    assert {o.record.tool for o in outcomes} == {"stripe.get_charge", "stripe.create_charge",
                                                 "stripe.refund"}
    assert {o.record.lifecycle for o in outcomes} == {"draft"}
    record = registry.history("stripe.refund")[0]
    assert (record.by, record.note, record.created) == ("alice", "first draft", "2025-01-02T03:04:05Z")
    assert record.manifest["version"] == 1 and record.manifest["lifecycle"] == "draft"


def test_a_file_may_name_a_tool_published_earlier(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.publish([{"tool": "b", "effect": "read_only", "permission": "p"}], by="a")
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "p", "requires": ["b"]}],
                     by="a")
    with pytest.raises(RegistryError, match="names 'zz', which has no manifest") as err:
        registry.publish([{"tool": "c", "effect": "read_only", "permission": "p",
                           "requires": ["zz"]}], by="a")
    assert err.value.code == "invalid"


def test_two_manifests_for_one_tool_in_a_publish_are_refused(tmp_path: Path) -> None:
    doc = {"tool": "a", "effect": "read_only", "permission": "p"}
    with pytest.raises(RegistryError, match="declared 2 times"):
        _registry(tmp_path).publish([doc, doc], by="x")


def test_an_unknown_status_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match="draft or approved"):
        _registry(tmp_path).publish([PAYMENTS], by="x", status="deprecated")


def test_diff_shows_what_changed_between_two_versions(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "p"}], by="x")
    registry.approve("a", by="y")
    text = registry.diff("a", 1, 2)
    assert text.startswith("--- a@v1\n+++ a@v2\n")
    assert '-  "lifecycle": "draft",' in text and '+  "lifecycle": "approved",' in text
    assert registry.diff("a", 2, 2) == ""


def test_list_shows_the_newest_and_the_enforced_version(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "p"}], by="x",
                     status="approved")
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "q"}], by="x")
    [summary] = registry.list()
    assert (summary.newest.version, summary.newest.lifecycle) == (2, "draft")
    assert summary.enforced is not None and summary.enforced.version == 1
    assert summary.versions == 2


def test_approval_keeps_the_author_and_records_the_approver_and_source(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "p"}], by="alice")
    record = registry.approve("a", by="bob").record
    assert (record.by, record.approved_by, record.source_version, record.note) == (
        "alice", "bob", 1, "approved from v1")
    stored = json.loads((tmp_path / "reg" / "tools" / "a" / "v2.json").read_text())
    assert stored == record.to_json()


def test_deprecating_again_with_the_same_replacement_changes_nothing(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "p"},
                      {"tool": "b", "effect": "read_only", "permission": "p"}], by="x",
                     status="approved")
    first = registry.deprecate("a", by="y", replaced_by="b")
    again = registry.deprecate("a", by="y", replaced_by="b")
    assert first.changed and not again.changed and again.record.version == 2
    assert registry.load()["a"].replaced_by == "b"


def test_operations_on_a_registry_that_does_not_exist_say_so(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=r"no registry at .*index\.json: publish something first"):
        _registry(tmp_path).approve("nope", by="x")


def test_operations_on_an_unknown_tool_say_so_and_suggest_a_close_name(tmp_path: Path) -> None:
    registry = _registry(tmp_path)
    registry.publish([{"tool": "stripe.refund", "effect": "idempotent", "permission": "p"}], by="x")
    with pytest.raises(RegistryError, match=r"stripe.refnd is not in the registry at .* \(did you "
                       r"mean stripe.refund\?\)"):
        registry.approve("stripe.refnd", by="x")


def test_the_benchmark_runs_and_prints_each_operation(capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.registry import main
    assert main(["-n", "20"]) == 0
    out = capsys.readouterr().out
    assert "sha256 (baseline)" in out and "ed25519 verify" in out and "20 versions" in out
