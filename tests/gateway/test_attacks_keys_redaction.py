"""Attacks on idempotency keys, redaction and recording outcomes (issue 17: #2, #7, #9).

The enforcement path in-process (``Gateway.call``, no HTTP in front) over the in-memory
ledger, with an upstream that answers what each test says: what is sent, what is stored
and what the caller gets are all in view.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from unwind.gateway.catalogue import LocalCatalogue
from unwind.gateway.enforce import CallRequest, CallResult, Gateway, Settings
from unwind.ledger.entry import REDACTED, Entry
from unwind.ledger.handle import KEPT_MAX_DEPTH
from unwind.ledger.lifecycle import AnyWrite
from unwind.ledger.memory import MemoryLocks, MemoryStore
from unwind.ledger.store import StoreUnavailable
from unwind.upstream.client import Answer, Prepared, Upstream
from unwind.upstream.secrets import LocalSecrets

ROOT = Path(__file__).resolve().parents[2]

MANIFESTS = """
- tool: t.charge
  effect: compensable
  permission: t:write
  idempotency: { key: "c-{{args.order_id}}", scope: global, carrier: { header: Idempotency-Key } }
  audit: { redaction: [$args.card_token, $result.card.number] }
  lookup: { tool: t.get, by: idempotency_key, arguments: { k: $key, order: $args.order_id } }
  upstream: { url: "http://127.0.0.1:9/charges", method: POST }
  compensation:
    tool: t.refund
    argument_map: { charge_id: $result.id, amount: "$args.amount?" }
- tool: t.get
  effect: read_only
  permission: t:write
  upstream: { url: "http://127.0.0.1:9/charges", method: GET }
- tool: t.refund
  effect: idempotent
  permission: t:write
  upstream: { url: "http://127.0.0.1:9/refunds", method: POST }
- tool: t.release
  effect: irreversible
  permission: t:write
  audit: { redaction: [$args.token, $result.release.signing_key] }
  draft:
    tool: t.release
    arguments: { tag: $args.tag, token: $args.token }
    handle: { id: $result.release.id, key: $result.release.signing_key, release: $result.release,
              token: $args.token }
    promote: t.get
    discard: t.refund
  upstream: { url: "http://127.0.0.1:9/releases", method: POST }
"""


class FakeUpstream(Upstream):
    """Answers each call with ``answer(prepared)`` and keeps what was sent."""

    def __init__(self, answer: Callable[[Prepared], Answer]) -> None:
        super().__init__()
        self.answer = answer
        self.sent: list[Prepared] = []

    async def send(self, p: Prepared) -> Answer:
        self.sent.append(p)
        return self.answer(p)


class FailingStore(MemoryStore):
    """The memory ledger, whose next ``fail`` updates (the writes after the write-ahead)
    fail as a store does when its disk or API server is away."""

    def __init__(self, fail: int) -> None:
        super().__init__()
        self.fail = fail

    async def transition(self, run: str, entry_id: str, write: AnyWrite) -> Entry:
        if self.fail > 0:
            self.fail -= 1
            raise StoreUnavailable("the ledger's disk is full")
        return await super().transition(run, entry_id, write)


def ok(data: Any) -> Callable[[Prepared], Answer]:
    return lambda p: Answer("ok", 200, data)


def deep(levels: int, leaf: Any = 1) -> Any:
    """An object nested ``levels`` levels deep."""
    value = leaf
    for _ in range(levels):
        value = {"a": value}
    return value


def gateway(tmp_path: Path, answer: Callable[[Prepared], Answer], *,
            paths: list[Path] | None = None, observe: bool = False,
            store: MemoryStore | None = None) -> tuple[Gateway, FakeUpstream, MemoryStore]:
    if paths is None:
        (tmp_path / "tools.yaml").write_text(MANIFESTS)
        paths = [tmp_path / "tools.yaml"]
    catalogue = LocalCatalogue(paths, observe=observe)
    assert catalogue.ready, catalogue.problem
    upstream = FakeUpstream(answer)
    store = store if store is not None else MemoryStore()
    gw = Gateway(catalogue, store, MemoryLocks(), upstream, LocalSecrets(environ={}),
                 Settings(scopes=frozenset({"*"}), actor="agent"))
    return gw, upstream, store


async def call(gw: Gateway, tool: str, arguments: dict[str, Any], entry_id: str,
               **flags: Any) -> CallResult:
    return await gw.call(CallRequest(tool, arguments, "run-1", entry_id, **flags))


def stored(store: MemoryStore, entry_id: str) -> Entry:
    return store.runs["run-1"][entry_id]


def everything_kept(store: MemoryStore, *results: CallResult) -> str:
    """Every stored entry and every report and body the caller got, as one text."""
    entries = [e.to_json() for run in store.runs.values() for e in run.values()]
    return json.dumps([entries, [[r.report, r.body] for r in results]])


# ---- #2: equal numbers, one key ----

async def test_charging_order_42_then_42_0_with_the_shipped_manifest_is_refused_as_a_duplicate(
        tmp_path: Path) -> None:
    # observe mode: the shipped stripe.create_charge needs two finance approvals, which
    # this test does not play; the duplicate refusal stays in force in observe mode.
    gw, upstream, store = gateway(tmp_path, ok({"id": "ch_1"}),
                                  paths=[ROOT / "manifests" / "payments.yaml"], observe=True)
    first = await call(gw, "stripe.create_charge",
                       {"order_id": 42, "amount": 9900, "card_token": "tok_visa_4242"}, "pay-1")
    assert first.status == 200, first.body
    again = await call(gw, "stripe.create_charge",
                       {"order_id": 42.0, "amount": 9900, "card_token": "tok_visa_4242"}, "pay-2")
    assert again.status == 409 and again.body["error"]["code"] == "duplicate", again.body
    assert again.body["error"]["entry"] == "pay-1"
    assert len(upstream.sent) == 1
    assert upstream.sent[0].headers["Idempotency-Key"] == "charge-42"
    # the key and the lookup built from $key carry the order, never the card token
    assert stored(store, "pay-1").key == "charge-42"
    assert "tok_visa_4242" not in everything_kept(store, first, again)


async def test_a_url_placeholder_fills_42_0_as_42(tmp_path: Path) -> None:
    gw, upstream, _ = gateway(tmp_path, ok({"id": "r1", "refunded": True}),
                              paths=[ROOT / "manifests" / "payments.yaml"])
    result = await call(gw, "stripe.refund", {"charge_id": 42.0}, "r-1")
    assert result.status == 200, result.body
    assert upstream.sent[0].url.endswith("/charges/42/refund")


# ---- #7: redacted values never reach the ledger ----

async def test_a_key_template_reading_the_redacted_card_token_is_never_served(
        tmp_path: Path) -> None:
    (tmp_path / "tools.yaml").write_text(MANIFESTS.replace(
        'key: "c-{{args.order_id}}"', 'key: "c-{{args.card_token}}"'))
    catalogue = LocalCatalogue([tmp_path / "tools.yaml"])
    assert not catalogue.ready
    assert "idempotency.key" in (catalogue.problem or "")
    assert "key on a non-secret argument" in (catalogue.problem or "")


async def test_a_staged_drafts_handle_keeps_no_redacted_result_or_argument_value(
        tmp_path: Path) -> None:
    answer = {"release": {"id": 7, "signing_key": "sk-live-do-not-store"}}
    gw, upstream, store = gateway(tmp_path, ok(answer))
    result = await call(gw, "t.release", {"tag": "v1", "token": "ghp-secret-token"}, "rel-1",
                        stage=True)
    assert result.status == 200, result.body
    assert upstream.sent[0].arguments == {"tag": "v1", "token": "ghp-secret-token"}
    entry = stored(store, "rel-1")
    assert entry.staged is not None
    assert entry.staged.handle == {"id": 7, "key": REDACTED, "token": REDACTED,
                                   "release": {"id": 7, "signing_key": REDACTED}}
    kept = everything_kept(store, result).replace(json.dumps(answer), "")  # the 200 body is the answer
    assert "sk-live-do-not-store" not in kept
    assert "ghp-secret-token" not in kept
    # the caller still gets the upstream's answer itself
    assert result.body == answer


async def test_a_redacted_result_value_in_an_upstream_error_body_is_masked(
        tmp_path: Path) -> None:
    body = {"error": "card declined", "card": {"number": "4242424242424242"}}
    gw, _, store = gateway(tmp_path, lambda p: Answer("error_status", 402, body, json.dumps(body)))
    result = await call(gw, "t.charge", {"order_id": 1, "card_token": "tok_x"}, "c-1")
    assert result.status == 502
    assert result.body["error"]["upstream"] == {"error": "card declined",
                                                "card": {"number": REDACTED}}
    assert "4242424242424242" not in everything_kept(store, result)


# ---- #9: an outcome that cannot be recorded is never a 200 ----

async def test_an_upstream_answering_a_300_levels_deep_result_leaves_the_entry_uncertain_and_no_200(
        tmp_path: Path) -> None:
    gw, upstream, store = gateway(tmp_path, ok({"id": deep(300)}))
    result = await call(gw, "t.charge", {"order_id": 5, "amount": 10}, "c-5")
    assert len(upstream.sent) == 1
    assert result.status == 502 and result.body["error"]["code"] == "upstream_error"
    assert "cannot be recorded" in result.body["error"]["message"]
    assert result.body["error"]["entry"] == "c-5"
    entry = stored(store, "c-5")
    assert entry.state == "uncertain"
    assert entry.error is not None and "compensation.argument_map.charge_id" in entry.error.message
    # what the write-ahead kept from the arguments stays, so the lookup can find the charge
    assert entry.handle is not None and entry.handle.args == {"order_id": 5, "amount": 10}
    assert entry.report is not None and entry.report["lookup"]["arguments"] == {
        "k": "c-5", "order": 5}
    # the key stays taken: a repeat is a duplicate, never a second charge
    again = await call(gw, "t.charge", {"order_id": 5, "amount": 10}, "c-6")
    assert again.status == 409 and len(upstream.sent) == 1


async def test_an_argument_300_levels_deep_that_the_ledger_must_keep_is_refused_before_anything_is_sent(
        tmp_path: Path) -> None:
    gw, upstream, store = gateway(tmp_path, ok({"id": "ch_1"}))
    result = await call(gw, "t.charge", {"order_id": 6, "amount": deep(300)}, "c-6")
    assert result.status == 400 and result.body["error"]["code"] == "validation_error"
    assert "the ledger cannot keep this call's arguments" in result.body["error"]["message"]
    assert "$args.amount" in result.body["error"]["message"]
    assert upstream.sent == []
    assert stored(store, "c-6").state == "refused"


async def test_a_ledger_that_fails_to_store_the_outcome_records_uncertain_and_answers_502(
        tmp_path: Path) -> None:
    gw, upstream, store = gateway(tmp_path, ok({"id": "ch_7"}), store=FailingStore(fail=1))
    result = await call(gw, "t.charge", {"order_id": 7, "card_token": "tok_secret_7"}, "c-7")
    assert len(upstream.sent) == 1
    assert result.status == 502 and result.body["error"]["code"] == "upstream_error"
    assert "the ledger could not store it" in result.body["error"]["message"]
    entry = stored(store, "c-7")
    assert entry.state == "uncertain"
    assert entry.report is not None and entry.report["undo"] is None
    assert "tok_secret_7" not in everything_kept(store, result)


async def test_a_ledger_that_stays_down_after_the_call_leaves_the_entry_pending_and_answers_502(
        tmp_path: Path) -> None:
    gw, upstream, store = gateway(tmp_path, ok({"id": "ch_8"}), store=FailingStore(fail=99))
    result = await call(gw, "t.charge", {"order_id": 8}, "c-8")
    assert len(upstream.sent) == 1
    assert result.status == 502
    assert stored(store, "c-8").state == "pending"
    assert result.report is not None
    assert any("stays pending" in w for w in result.report["warnings"])


@pytest.mark.parametrize("kept", [float("inf"), deep(KEPT_MAX_DEPTH + 1)])
async def test_a_kept_result_value_the_ledger_cannot_store_is_uncertain(
        tmp_path: Path, kept: Any) -> None:
    gw, _, store = gateway(tmp_path, ok({"id": kept}))
    result = await call(gw, "t.charge", {"order_id": 9}, "c-9")
    assert result.status == 502
    assert stored(store, "c-9").state == "uncertain"


async def test_a_kept_value_at_the_depth_bound_is_recorded(tmp_path: Path) -> None:
    gw, _, store = gateway(tmp_path, ok({"id": deep(KEPT_MAX_DEPTH)}))
    result = await call(gw, "t.charge", {"order_id": 10}, "c-10")
    assert result.status == 200
    assert stored(store, "c-10").state == "succeeded"
