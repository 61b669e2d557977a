"""Settling by hand (issue 27.2): `unwind settle --ledger FILE ENTRY --reason TEXT` records
who resolved an entry, when and why, through the lifecycle's person writer; the rollback then
leaves it alone, and the evidence lists it (27.5)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.lifecycle_paths import store_entry
from unwind.ledger.entry import Entry, Handle, Times, stamp
from unwind.ledger.filestore import FileStore
from unwind.ledger.plan import plan_entry
from unwind.undo.sources import load_versions

from .conftest import ROOT, unwind

AT = "2026-03-01T10:00:00.000Z"


def entry(id_: str, state: str, **kw: Any) -> Entry:
    return Entry(id=id_, tool="github.create_comment", actor="agent", state=state,  # type: ignore[arg-type]
                 handle=Handle(args={"repo": "octo/hello"}, result={"id": 7}),
                 times=Times(requested=AT, started=AT, finished=AT), **kw)


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    store = FileStore(tmp_path / "ledger")
    store_entry(store, "run-1", entry("c-1", "undo_failed", undo={"outcome": "undo_failed"}))
    store_entry(store, "run-1", entry("c-2", "undone"))
    future = stamp(datetime.now(UTC) + timedelta(hours=1))
    store_entry(store, "run-1", entry("c-3", "pending", deadline=future))
    return tmp_path / "ledger" / "run-1.json"


def entries(ledger: Path) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in json.loads(ledger.read_text())["status"]["entries"]}


def test_a_failed_undo_settled_by_hand_records_who_when_why_and_what_it_was(ledger: Path) -> None:
    ran = unwind("settle", "--ledger", ledger, "c-1", "--reason", "deleted the comment in the UI",
                 "--by", "alice")
    assert ran.code == 0, ran.err
    assert ran.out.startswith("settled entry c-1 (github.create_comment, was undo_failed) of run "
                              "run-1 as alice (self-declared): deleted the comment in the UI")
    settled = entries(ledger)["c-1"]
    assert settled["state"] == "settled"
    assert settled["settled"]["by"] == "alice" and settled["settled"]["was"] == "undo_failed"
    assert settled["settled"]["identities"] == "self-declared"
    assert settled["settled"]["reason"] == "deleted the comment in the UI"
    m = load_versions([str(ROOT / "manifests")])
    step = plan_entry(Entry.model_validate(settled), m, datetime.now(UTC))
    assert step.action == "skip" and step.reason.startswith("settled by hand by alice at ")


def test_settle_refuses_what_has_nothing_standing_a_call_in_flight_and_no_reason(ledger: Path) -> None:
    undone = unwind("settle", "--ledger", ledger, "c-2", "--reason", "x", "--by", "alice")
    assert undone.code == 1
    assert "entry c-2 is undone: nothing stands to settle" in undone.err
    flying = unwind("settle", "--ledger", ledger, "c-3", "--reason", "x", "--by", "alice")
    assert flying.code == 1 and "its call may still be in flight" in flying.err
    missing = unwind("settle", "--ledger", ledger, "c-9", "--reason", "x")
    assert missing.code == 1 and "there is no entry c-9 in this ledger" in missing.err
    no_reason = unwind("settle", "--ledger", ledger, "c-1")
    assert no_reason.code == 1 and "--reason TEXT" in no_reason.err
    again = [unwind("settle", "--ledger", ledger, "c-1", "--reason", "x", "--by", b) for b in "ab"]
    assert again[0].code == 0 and again[1].code == 1 and "is settled already (by a" in again[1].err
    assert entries(ledger)["c-2"]["state"] == "undone"


def test_the_evidence_lists_every_settle_and_every_rollback_request_with_its_reason(
        ledger: Path, tmp_path: Path) -> None:
    assert unwind("keygen", tmp_path / "keys" / "ev").code == 0
    assert unwind("settle", "--ledger", ledger, "c-1", "--reason", "fixed by hand",
                  "--by", "alice").code == 0
    (ledger.parent / "run-1.rollback.json").write_text(json.dumps({"ledger": "run-1", "dropped": 2,
        "rollbacks": [{"by": "bob", "reason": "the agent went rogue", "plan": {"steps": []}}]}))
    out = tmp_path / "ev.json"
    ran = unwind("ledger", "export", ledger, "--key", tmp_path / "keys" / "ev.key", "--file", out)
    assert ran.code == 0, ran.err
    ev = json.loads(out.read_text())["evidence"]
    assert [(s["entry"], s["by"], s["reason"], s["was"]) for s in ev["settles"]] == [
        ("c-1", "alice", "fixed by hand", "undo_failed")]
    assert ev["rollbacks"][0]["reason"] == "the agent went rogue"
    assert ev["rollbacks_dropped"] == 2
    assert unwind("ledger", "verify", out, "--trust", tmp_path / "keys" / "ev.pub").code == 0


def test_settle_says_what_it_recorded_as_yaml_or_json_documents(ledger: Path) -> None:
    import yaml

    ran = unwind("settle", "--ledger", ledger, "c-1", "--reason", "deleted by hand", "--by", "alice", "-o", "yaml")
    assert ran.code == 0, ran.err
    said = yaml.safe_load(ran.out)  # a YAML document, not a Python repr
    assert said["entry"] == "c-1" and said["by"] == "alice (self-declared)"
    assert said["settled"]["reason"] == "deleted by hand" and said["settled"]["was"] == "undo_failed"
