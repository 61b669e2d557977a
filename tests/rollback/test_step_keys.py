"""Undo step keys belong to one ledger object (issue 17 #8): the operator's frozen steps and
the Jobs' inputs carry keys derived from the ledger's namespace and uid, never its name."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from unwind.ledger.entry import Entry, Times, stamp
from unwind.ledger.handle import build_handle
from unwind.ledger.plan import Versions
from unwind.manifest.canonical import checksum
from unwind.operator.rollback import Context, LedgerView, decide
from unwind.undo.sources import load_versions

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)


def story(versions: Versions) -> list[Entry]:
    out = []
    for seq, (id_, tool, args, result) in enumerate([
            ("c-1", "github.create_comment", {"repo": "octo/hello", "issue": 7}, {"id": 2}),
            ("i-1", "github.create_issue", {"repo": "octo/hello", "title": "t"}, {"number": 3})], 1):
        m = versions.tools[tool]
        when = stamp(NOW.replace(minute=seq))
        out.append(Entry(id=id_, seq=seq, tool=tool, checksum=checksum(m), effect=m.effect,
                         actor="agent", state="succeeded", handle=build_handle(m, args, result),
                         times=Times(requested=when, started=when, finished=when)))
    return out


def frozen_keys(versions: Versions, uid: str, namespace: str = "shop") -> dict[str, str]:
    view = LedgerView("run-42", uid, "run-42", 2, {"requested": True}, None, [], story(versions))
    d = decide(view, lambda: versions, {}, {}, Context(namespace, NOW.replace(hour=11), "unwind:test", 1))
    steps = d.status["rollback"]["steps"]
    return {s["entry"]: s["idempotency_key"] for s in steps if s.get("idempotency_key")}


def test_a_ledger_recreated_under_the_same_name_freezes_other_undo_keys_in_the_cluster() -> None:
    versions = load_versions([str(ROOT / "manifests"), str(ROOT / "tests/rollback/extra.yaml")])
    first = frozen_keys(versions, "0f5c2a9e-0000-4000-8000-000000000001")
    assert first and first == frozen_keys(versions, "0f5c2a9e-0000-4000-8000-000000000001")
    again = frozen_keys(versions, "0f5c2a9e-0000-4000-8000-000000000002")
    elsewhere = frozen_keys(versions, "0f5c2a9e-0000-4000-8000-000000000001", namespace="other")
    assert set(first) == set(again) == set(elsewhere)
    assert all(first[e] != again[e] and first[e] != elsewhere[e] for e in first)
