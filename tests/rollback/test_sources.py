"""Reading a plan's inputs: every page of a ledger, saved kubectl output, and the manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.lifecycle_paths import store_entry
from unwind.ledger.entry import Entry, Times
from unwind.ledger.filestore import FileStore
from unwind.manifest.canonical import checksum
from unwind.undo.sources import SourceError, load_versions, read_ledger_file

ROOT = Path(__file__).resolve().parents[2]


def filled(folder: Path, n: int) -> Path:
    store = FileStore(folder, page_bytes=2000)  # small pages: a run of several pages
    for i in range(n):
        store_entry(store, "run-1", Entry(id=f"e-{i}", tool="github.create_issue", actor="agent",
                                         state="succeeded", times=Times(requested="2026-03-01T10:00:00.000Z")))
    return folder / "run-1.json"


def test_every_page_of_a_run_is_read_in_order(tmp_path: Path) -> None:
    path = filled(tmp_path, 30)
    assert (tmp_path / "run-1.p2.json").exists()
    snap = read_ledger_file(path)
    assert (snap.name, snap.run, len(snap.pages)) == ("run-1", "run-1", len(list(tmp_path.glob("run-1*.json"))))
    assert [e.id for e in snap.entries] == [f"e-{i}" for i in range(30)]


def test_a_missing_page_is_an_error_not_half_a_run(tmp_path: Path) -> None:
    path = filled(tmp_path, 30)
    (tmp_path / "run-1.p2.json").unlink()
    with pytest.raises(SourceError, match=r"continues in run-1.p2, which cannot be found"):
        read_ledger_file(path)


def test_a_saved_list_of_pages_is_read_as_kubectl_prints_it(tmp_path: Path) -> None:
    path = filled(tmp_path / "ledger", 30)
    pages = [json.loads(p.read_text()) for p in sorted((tmp_path / "ledger").glob("run-1*.json"))]
    (tmp_path / "saved.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List",
                                                     "items": list(reversed(pages))}))
    assert [e.id for e in read_ledger_file(tmp_path / "saved.json").entries] == \
        [e.id for e in read_ledger_file(path).entries]


def test_a_file_that_is_not_a_ledger_is_refused_naming_what_it_is(tmp_path: Path) -> None:
    (tmp_path / "x.json").write_text(json.dumps({"kind": "ConfigMap"}))
    with pytest.raises(SourceError, match="not an EffectLedger \\(kind 'ConfigMap'\\)"):
        read_ledger_file(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{not json")
    with pytest.raises(SourceError, match="not JSON"):
        read_ledger_file(tmp_path / "y.json")


def test_a_wrong_entry_field_is_named_with_its_page_and_index(tmp_path: Path) -> None:
    path = filled(tmp_path, 2)
    data = json.loads(path.read_text())
    data["status"]["entries"][1]["state"] = "exploded"
    path.write_text(json.dumps(data))
    with pytest.raises(SourceError, match=r"\(page 1\): status.entries\[1\].state: Input should be"):
        read_ledger_file(path)


def test_todays_manifests_and_older_versions_are_found_by_checksum(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("tool: stripe.refund\neffect: idempotent\npermission: payments:refund\n"
                   "version: 1\n")
    versions = load_versions([str(ROOT / "manifests")], [str(old)])
    assert versions.tools["stripe.refund"].permission == "payments:refund"
    older = [m for m in versions.by_checksum.values()
             if m.tool == "stripe.refund" and m is not versions.tools["stripe.refund"]]
    assert len(older) == 1 and older[0].owner == []
    assert versions.by_checksum[checksum(older[0])] is older[0]


def test_manifests_that_are_not_valid_are_refused_with_the_first_problems(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("tool: a\neffect: compensable\npermission: p\n")
    with pytest.raises(SourceError, match=r"are not valid: .*compensation"):
        load_versions([str(tmp_path)])
