"""`unwind ledger export` and `unwind ledger verify`: signed evidence of a run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.lifecycle_paths import store_entry
from unwind.ledger.entry import (
    ApprovalDecision,
    ApprovalRulesRecord,
    Entry,
    EntryApproval,
    Handle,
    Times,
)
from unwind.ledger.filestore import FileStore

from .conftest import unwind

AT = "2026-03-01T10:00:00.000Z"


@pytest.fixture
def ledger(tmp_path: Path) -> Path:
    store = FileStore(tmp_path / "ledger")
    approval = EntryApproval(
        rules=ApprovalRulesRecord(roles=["finance"], quorum=1), identities="self-declared",
        state="approved", decisions=[ApprovalDecision(name="d1", user="alice", groups=["finance"],
                                                      decision="approve", created=AT)])
    store_entry(store, "run-1", Entry(id="pay-1", tool="stripe.create_charge", actor="agent",
                                     state="undone", approval=approval,
                                     handle=Handle(result={"id": "ch_1"}), times=Times(requested=AT),
                                     undo={"action": "compensate", "outcome": "undone",
                                           "idempotency_key": "unwind-compensate-1"}))
    store_entry(store, "run-1", Entry(id="c-1", tool="github.create_comment", actor="agent",
                                     state="succeeded", times=Times(requested=AT)))
    (tmp_path / "ledger" / "run-1.rollback.json").write_text(json.dumps(
        {"ledger": "run-1", "rollbacks": [{"by": "bob", "plan": {"ledger": "run-1", "steps": []}}]}))
    return tmp_path / "ledger" / "run-1.json"


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    assert unwind("keygen", tmp_path / "keys" / "ev").code == 0
    return tmp_path / "keys" / "ev.key", tmp_path / "keys" / "ev.pub"


def export(ledger: Path, key: Path, out: Path) -> dict[str, Any]:
    ran = unwind("ledger", "export", ledger, "--key", key, "--file", out)
    assert ran.code == 0, ran.err
    return dict(json.loads(out.read_text()))


def test_an_exported_evidence_file_holds_the_run_and_verifies_with_the_public_key(
        ledger: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    doc = export(ledger, keys[0], tmp_path / "ev.json")
    ev = doc["evidence"]
    assert doc["format"] == "unwind.dev/evidence/v1" and doc["digest"].startswith("sha256:")
    assert [e["id"] for e in ev["entries"]] == ["pay-1", "c-1"]
    assert ev["approvals"] == [{"entry": "pay-1", "tool": "stripe.create_charge", "actor": "agent",
                                "identities": "self-declared", "state": "approved",
                                "rules": {"roles": ["finance"], "quorum": 1, "timeout_ms": None,
                                          "on_timeout": "deny", "escalate_to": []},
                                "decisions": [{"name": "d1", "user": "alice",
                                               "groups": ["finance"], "decision": "approve",
                                               "reason": "", "created": AT,
                                               "arguments_sha256": None}]}]
    assert ev["steps"] == [{"entry": "pay-1", "tool": "stripe.create_charge", "state": "undone",
                            "action": "compensate", "outcome": "undone",
                            "idempotency_key": "unwind-compensate-1"}]
    assert ev["rollbacks"] == [{"by": "bob", "plan": {"ledger": "run-1", "steps": []}}]
    ok = unwind("ledger", "verify", tmp_path / "ev.json", "--trust", keys[1])
    assert ok.code == 0 and ok.out.startswith("ok: evidence of ledger run-1 (2 entries)")


@pytest.mark.parametrize(("tamper", "code"), [
    (lambda d: d["evidence"]["entries"][0].update(state="succeeded"), "digest_mismatch"),
    (lambda d: d["evidence"]["approvals"][0]["decisions"][0].update(user="mallory"),
     "digest_mismatch"),
    (lambda d: d.pop("signature"), "unsigned"),
    (lambda d: d.update(format="something-else"), "not_evidence"),
])
def test_tampered_evidence_is_refused_with_a_code(
        ledger: Path, keys: tuple[Path, Path], tmp_path: Path, tamper: Any, code: str) -> None:
    doc = export(ledger, keys[0], tmp_path / "ev.json")
    tamper(doc)
    (tmp_path / "ev.json").write_text(json.dumps(doc))
    ran = unwind("ledger", "verify", tmp_path / "ev.json", "--trust", keys[1])
    assert ran.code == 1 and f": {code}: " in ran.err


def test_evidence_changed_together_with_its_digest_fails_the_signature(
        ledger: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    from unwind.undo.evidence import digest_of

    doc = export(ledger, keys[0], tmp_path / "ev.json")
    doc["evidence"]["steps"] = []
    doc["digest"] = digest_of(doc["evidence"])
    (tmp_path / "ev.json").write_text(json.dumps(doc))
    ran = unwind("ledger", "verify", tmp_path / "ev.json", "--trust", keys[1])
    assert ran.code == 1 and ": bad_signature: " in ran.err


def test_evidence_signed_by_a_key_that_is_not_trusted_is_refused(
        ledger: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    assert unwind("keygen", tmp_path / "other").code == 0
    export(ledger, keys[0], tmp_path / "ev.json")
    ran = unwind("ledger", "verify", tmp_path / "ev.json", "--trust", tmp_path / "other.pub")
    assert ran.code == 1 and ": untrusted: " in ran.err


def test_an_evidence_signature_does_not_pass_for_a_manifest_signature(
        ledger: Path, keys: tuple[Path, Path], tmp_path: Path) -> None:
    from unwind.registry.signing import Signature, TrustStore, signing_message

    doc = export(ledger, keys[0], tmp_path / "ev.json")
    trust = TrustStore.from_files([keys[1]])
    sig = doc["signature"]
    assert trust.check(signing_message("t", 1, doc["digest"]),
                       Signature(sig["key_id"], sig["value"])) == "bad_signature"


def test_exporting_a_ledger_that_is_neither_a_file_nor_reachable_says_so(
        keys: tuple[Path, Path], tmp_path: Path) -> None:
    ran = unwind("ledger", "export", "no-such-run", "--key", keys[0], "--file", tmp_path / "ev.json",
                 "--kubeconfig", str(tmp_path / "missing-kubeconfig"))
    assert ran.code == 1 and "no-such-run is not a file" in ran.err
