"""The handle keeps only what an undo names, redaction masks it, and the report reads it."""

from __future__ import annotations

from typing import Any

import pytest

from unwind.api.resources import LedgerSpec, LedgerStatus
from unwind.ledger.entry import REDACTED, Entry, Times
from unwind.ledger.handle import (
    KEPT_MAX_BYTES,
    KEPT_MAX_DEPTH,
    HandleError,
    build_handle,
    mask_answer,
    mask_text,
    mask_value,
    secret_texts,
    staged_handle,
)
from unwind.ledger.report import effect_report
from unwind.ledger.ulid import new_ulid
from unwind.manifest.model import ToolManifest

CHARGE = ToolManifest.model_validate({
    "tool": "stripe.create_charge", "effect": "compensable", "permission": "payments:write",
    "idempotency": {"key": "charge-{{args.order_id}}", "scope": "global"},
    "audit": {"redaction": ["$args.card_token"]},
    "lookup": {"tool": "stripe.get_charge", "by": "idempotency_key",
               "arguments": {"idempotency_key": "$key"}},
    "compensation": {"tool": "stripe.refund", "argument_map": {"charge_id": "$result.id",
                                                               "amount": "$args.amount"},
                     "verification": {"tool": "stripe.get_charge",
                                      "arguments": {"charge_id": "$result.id"},
                                      "expect": {"refunded": True}}},
})
ARGS = {"order_id": "o1", "amount": 2500, "card_token": "tok_secret", "note": "keep out"}
RESULT = {"id": "ch_1", "status": "paid", "card": {"token": "tok_secret"}}


def report(m: ToolManifest, outcome: Any = "succeeded", **kw: Any) -> dict[str, Any]:
    handle = build_handle(m, ARGS, RESULT)
    return effect_report(m, outcome=outcome, handle=handle, key_sent="charge-o1",
                         key="charge-o1", ledger="run-1", entry="e1", **kw)


def test_the_handle_keeps_only_the_values_the_references_name() -> None:
    handle = build_handle(CHARGE, ARGS, RESULT)
    assert handle.args == {"amount": 2500}
    assert handle.result == {"id": "ch_1"}


def test_a_redacted_value_named_by_an_undo_makes_the_undo_unavailable() -> None:
    m = CHARGE.model_copy(update={"audit": CHARGE.audit.model_copy(  # type: ignore[union-attr]
        update={"redaction": ["$args.amount"]})})
    handle = build_handle(m, ARGS, RESULT)
    assert handle.args == {"amount": REDACTED}
    r = effect_report(m, outcome="succeeded", handle=handle, key_sent=None, key="charge-o1",
                      ledger="run-1", entry="e1")
    assert r["undo"] is None
    assert r["undo_unavailable"] == ("the undo is unavailable: compensation.argument_map.amount "
                                     "reads $args.amount, which audit.redaction masks in the ledger")


def test_the_report_has_exactly_the_documented_fields_and_the_undo() -> None:
    r = report(CHARGE)
    assert list(r) == ["class", "tool", "idempotency_key", "undo", "undo_unavailable",
                       "deadline_ms", "lookup", "ledger", "staged", "warnings"]
    assert r["undo"] == {"kind": "compensate", "tool": "stripe.refund",
                         "arguments": {"charge_id": "ch_1", "amount": 2500}}
    assert r["lookup"] == {"tool": "stripe.get_charge", "by": "idempotency_key",
                           "arguments": {"idempotency_key": "charge-o1"}}
    assert r["ledger"] == {"name": "run-1", "entry": "e1"}


def test_an_undo_that_reads_the_current_revision_is_reported_with_the_read_not_as_unavailable() -> None:
    # issue 30.1: $current is read right before the undo, so no answer holds it; the
    # report said "the undo is unavailable: _rev: ... found nothing" of an undo that runs
    from tests.rollback.revisions import TOOLS
    update = TOOLS["docs.update"]
    handle = build_handle(update, {"id": "a", "title": "final", "_rev": "1-a"},
                          {"ok": True, "id": "a", "rev": "2-a"}, before={"_id": "a", "title": "draft"})
    r = effect_report(update, outcome="succeeded", handle=handle, key_sent=None, key=None,
                      ledger="run-1", entry="e1")
    assert r["undo_unavailable"] is None
    assert r["undo"] == {"kind": "inverse", "tool": "docs.restore",
                         "arguments": {"id": "a", "title": "draft"},
                         "current": {"tool": "docs.get", "arguments": {"id": "a"},
                                     "fills": {"arguments._rev": "$current._rev"}}}
    create = TOOLS["docs.create"]
    handle = build_handle(create, {"id": "a", "title": "draft"}, {"ok": True, "id": "a", "rev": "1-a"})
    undo = effect_report(create, outcome="succeeded", handle=handle, key_sent=None, key=None,
                         ledger="run-1", entry="e1")["undo"]
    assert undo["arguments"] == {"id": "a"}
    assert undo["current"]["fills"] == {"headers.If-Match": "$current._rev"}


def test_a_failed_call_reports_no_undo_but_keeps_the_lookup() -> None:
    r = report(CHARGE, "failed")
    assert r["undo"] is None and r["undo_unavailable"] is None
    assert r["lookup"] is not None


def test_secret_text_is_masked_in_messages_and_values() -> None:
    secrets = secret_texts(CHARGE, ARGS, RESULT)
    assert secrets == ["tok_secret"]
    assert mask_text("card tok_secret declined", secrets) == f"card {REDACTED} declined"
    assert mask_value({"a": ["x tok_secret"], "tok_secret": 1}, secrets) == {
        "a": [f"x {REDACTED}"], REDACTED: 1}


def test_a_ulid_is_26_characters_and_sorts_by_time() -> None:
    a, b = new_ulid(1_000), new_ulid(2_000)
    assert len(a) == 26 and a < b


def test_a_ledger_page_holds_entries_in_its_status() -> None:
    entry = Entry(id="e1", seq=1, tool="t", actor="me", state="pending",
                  times=Times(requested="2026-11-30T10:00:00.000Z"))
    status = LedgerStatus(entries=[entry], entryCount=1, lastState="pending")
    assert LedgerSpec(run="run-1").page == 1
    assert status.model_dump(mode="json", exclude_none=True)["entries"][0]["state"] == "pending"


RELEASE = ToolManifest.model_validate({
    "tool": "gh.release", "effect": "irreversible", "permission": "repo:release",
    "audit": {"redaction": ["$args.token", "$result.release.signing_key"]},
    "draft": {"tool": "gh.release", "arguments": {"tag": "$args.tag"},
              "handle": {"id": "$result.release.id", "key": "$result.release.signing_key",
                         "release": "$result.release", "token": "$args.token"},
              "promote": "gh.publish", "discard": "gh.delete"},
})


def test_a_staged_handle_masks_redacted_result_and_argument_paths_it_reads_or_holds() -> None:
    args = {"tag": "v1", "token": "ghp-1"}
    result = {"release": {"id": 7, "signing_key": "sk-9"}}
    secrets = secret_texts(RELEASE, args, result)
    staged = staged_handle(RELEASE, args, result, secrets)
    assert staged == {"id": 7, "key": REDACTED, "token": REDACTED,
                      "release": {"id": 7, "signing_key": REDACTED}}
    assert result == {"release": {"id": 7, "signing_key": "sk-9"}}  # the answer is untouched


def test_a_redacted_result_path_kept_in_the_handle_is_masked() -> None:
    m = CHARGE.model_copy(update={"audit": CHARGE.audit.model_copy(  # type: ignore[union-attr]
        update={"redaction": ["$result.id"]})})
    handle = build_handle(m, ARGS, RESULT)
    assert handle.result == {"id": REDACTED}
    assert "ch_1" not in str(handle.model_dump())


def test_secret_texts_cover_redacted_result_values() -> None:
    m = CHARGE.model_copy(update={"audit": CHARGE.audit.model_copy(  # type: ignore[union-attr]
        update={"redaction": ["$result.card.token", "$args.amount"]})})
    assert secret_texts(m, ARGS, RESULT) == ["tok_secret", "2500"]


def test_a_kept_value_too_deep_or_not_json_raises_when_strict_and_is_left_out_otherwise() -> None:
    deep: Any = 1
    for _ in range(KEPT_MAX_DEPTH + 1):
        deep = {"a": deep}
    for bad in (deep, float("nan")):
        with pytest.raises(HandleError) as caught:
            build_handle(CHARGE, ARGS, {**RESULT, "id": bad}, strict=True)
        assert "compensation.argument_map.charge_id keeps $result.id" in caught.value.reason
        assert build_handle(CHARGE, ARGS, {**RESULT, "id": bad}).result == {}


def test_kept_values_larger_than_the_bound_raise_when_strict() -> None:
    big = "x" * (KEPT_MAX_BYTES + 1)
    with pytest.raises(HandleError, match="KiB per call"):
        build_handle(CHARGE, ARGS, {**RESULT, "id": big}, strict=True)


def test_an_error_body_is_masked_at_redacted_result_paths_without_changing_it() -> None:
    m = CHARGE.model_copy(update={"audit": CHARGE.audit.model_copy(  # type: ignore[union-attr]
        update={"redaction": ["$result.card.token"]})})
    body = {"error": "declined", "card": {"token": "tok_other"}}
    assert mask_answer(m, body, []) == {"error": "declined", "card": {"token": REDACTED}}
    assert body["card"] == {"token": "tok_other"}
