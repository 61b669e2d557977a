"""The five ways issue 26 found to break "no effect lost, run twice, or left live while the
ledger says it was undone", each reproduced deterministically, in a ledger folder and in
EffectLedgers (the cluster store against a fake API server with real resourceVersions).

Each test fails on the code before issue 26 (the break happens) and passes after it. They
use only the interfaces both have: ``Gateway.call``, the stores' ``create``/``entries``, the
local rollback's ``execute``, the operator's ``decide`` passes, ``unwind approve``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from unwind.ledger.entry import Entry, Handle, Times, stamp
from unwind.ledger.handle import build_handle
from unwind.manifest.canonical import canonical_json, checksum
from unwind.undo.sources import load_versions

from .harness import ACTOR, Clock, Cluster, Folder, Ledgers, call, close, serving, tools

PAY = {"order_id": "42", "amount": 100}


@pytest.fixture(params=["folder", "cluster"])
def ledgers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledgers]:
    yield Folder(tmp_path / "ledger") if request.param == "folder" else Cluster()


def charges_of(up: Any, order: str) -> list[dict[str, Any]]:
    return [c for c in up.charges.values() if c["order_id"] == order]


def killed_write_ahead(manifests: Path, entry_id: str, arguments: dict[str, Any]) -> Entry:
    """The pending entry of a ``once.pay`` call whose gateway was killed right after writing
    it ahead (and before it recorded that the key was held by another call)."""
    import hashlib
    m = load_versions([str(manifests)]).tools["once.pay"]
    return Entry(id=entry_id, tool="once.pay", checksum=checksum(m), effect="compensable",
                 key=f"pay-{arguments['order_id']}", scope="global", actor=ACTOR, state="pending",
                 arguments_sha256="sha256:" + hashlib.sha256(canonical_json(arguments)).hexdigest(),
                 handle=build_handle(m, arguments, {}), times=Times(requested=stamp()))


# ---- (1) ----

async def test_a_rollback_during_a_call_is_not_overwritten_by_the_calls_outcome(
        ledgers: Ledgers, tmp_path: Path) -> None:
    """Stop it, roll it back: a rollback started while a call is in flight (the upstream has
    not applied it yet) must end with the effect undone, once, and the ledger saying so."""
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests)
        gate = up.gate("charges.create")
        flying = asyncio.ensure_future(gw.call(call("once.pay", PAY, "run-1", "pay-1")))
        await gate.arrived.wait()  # written ahead, sent; the upstream has not applied it
        rolling = asyncio.ensure_future(ledgers.roll_back("run-1", manifests))
        await asyncio.sleep(0.5)  # the rollback goes as far as it will while the call flies
        gate.release.set()
        result = await flying
        await rolling
        await close(gw)
        [charge] = charges_of(up, "42")
        assert result.status in (200, 502), result.body
        entry = ledgers.entries("run-1")["pay-1"]
        assert entry.state == "undone", (entry.state, entry.undo)
        assert charge["refunded"] is True
        assert up.refunds(charge["id"]) == 1


# ---- (2) ----

async def test_two_approved_repeats_of_one_key_do_not_both_run(ledgers: Ledgers, tmp_path: Path) -> None:
    """Two calls that need approval, two Idempotency-Keys, one rendered key: the second is a
    duplicate at once (no human asked), and the key's effect happens once however the
    approvals and the repeats come."""
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests)
        args = {"order_id": "7", "amount": 5}
        first = await gw.call(call("once.pay_approved", args, "run-1", "a-1"))
        assert first.status == 428, first.body
        second = await gw.call(call("once.pay_approved", args, "run-1", "a-2"))
        assert second.status == 409 and second.body["error"]["code"] == "duplicate", second.body
        assert second.body["error"]["entry"] == "a-1"
        for entry_id, entry in ledgers.entries("run-1").items():  # approvers approve what waits
            if entry.state == "awaiting_approval":
                await ledgers.approve("run-1", entry_id, "alice")
        repeats = await asyncio.gather(gw.call(call("once.pay_approved", args, "run-1", "a-1")),
                                       gw.call(call("once.pay_approved", args, "run-1", "a-2")))
        await close(gw)
        assert sorted(r.status for r in repeats)[0] == 200, [r.body for r in repeats]
        assert up.effects["charges.create"] == 1
        assert len(charges_of(up, "7")) == 1


# ---- (3) ----

async def test_a_slow_capture_keeps_its_key_lock(ledgers: Ledgers, tmp_path: Path) -> None:
    """A capture slower than the lock's old fixed grace: a retry with a new Idempotency-Key
    is a duplicate (the lock stands until its deadline, from the capture's and the call's
    timeouts), and the effect happens once."""
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        clock = Clock()
        grace = {"lock_grace": timedelta(seconds=1)}
        a, b = ledgers.gateway(manifests, clock, **grace), ledgers.gateway(manifests, clock, **grace)
        up.charges["ch_seed"] = {"id": "ch_seed", "order_id": "seed", "amount": 1, "status": "paid",
                                 "refunded": False, "idempotency_key": None}
        gate = up.gate("charges.get")  # the first capture is slow
        slow = asyncio.ensure_future(a.call(call("once.pay_captured", {"order_id": "9"}, "run-1", "c-1")))
        await gate.arrived.wait()
        clock.advance(2)  # past the grace, long before the capture's and the call's timeouts
        retry = await b.call(call("once.pay_captured", {"order_id": "9"}, "run-2", "c-2"))
        gate.release.set()
        done = await slow
        await close(a, b)
        assert retry.status == 409 and retry.body["error"]["code"] == "duplicate", retry.body
        assert done.status == 200, done.body
        assert up.effects["charges.create"] == 1


async def test_a_call_that_lost_its_key_past_its_deadline_is_refused_right_before_its_upstream(
        ledgers: Ledgers, tmp_path: Path) -> None:
    """The same gap, for a call slower than its deadline: another call may then break the
    lock and run; the slow one reads its lock again right before the upstream and is
    refused, so the effect still happens once."""
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        clock = Clock()
        a, b = ledgers.gateway(manifests, clock), ledgers.gateway(manifests, clock)
        up.charges["ch_seed"] = {"id": "ch_seed", "order_id": "seed", "amount": 1, "status": "paid",
                                 "refunded": False, "idempotency_key": None}
        gate = up.gate("charges.get")
        slow = asyncio.ensure_future(a.call(call("once.pay_captured", {"order_id": "9"}, "run-1", "c-1")))
        await gate.arrived.wait()
        clock.advance(3600)  # far past every deadline: the lock may be broken now
        other = await b.call(call("once.pay_captured", {"order_id": "9"}, "run-2", "c-2"))
        gate.release.set()
        late = await slow
        await close(a, b)
        assert other.status == 200, other.body
        assert late.status == 409 and late.body["error"]["code"] == "duplicate", late.body
        assert up.effects["charges.create"] == 1
        assert ledgers.entries("run-1")["c-1"].state == "refused"


# ---- (4) ----

async def test_max_runs_is_counted_where_it_is_checked(ledgers: Ledgers, tmp_path: Path) -> None:
    """100 concurrent calls into new runs with --max-runs 3 make 3 ledgers; a gateway started
    again (the kubelet restarted it) keeps counting from what the store holds."""
    async with serving() as (_, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests, max_runs=3)
        results = await asyncio.gather(*(gw.call(call("once.pay", {"order_id": f"o{n}", "amount": 1},
                                                      f"run-{n}", f"e-{n}")) for n in range(100)))
        await close(gw)
        assert sorted(r.status for r in results) == [200] * 3 + [429] * 97
        assert len(ledgers.ledgers()) == 3
        await _restarted_gateway_counts_on(ledgers, manifests)


async def test_max_runs_keeps_counting_after_the_gateway_restarts(ledgers: Ledgers, tmp_path: Path) -> None:
    """Three runs written one after the other, then the gateway restarted: a fourth run in
    the same window is refused, as it would have been without the restart."""
    async with serving() as (_, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests, max_runs=3)
        for n in range(3):
            made = await gw.call(call("once.pay", {"order_id": f"o{n}", "amount": 1}, f"run-{n}", f"e-{n}"))
            assert made.status == 200, made.body
        await close(gw)
        await _restarted_gateway_counts_on(ledgers, manifests)


async def _restarted_gateway_counts_on(ledgers: Ledgers, manifests: Path) -> None:
    again = ledgers.gateway(manifests, max_runs=3)
    after = await again.call(call("once.pay", {"order_id": "later", "amount": 1}, "run-later", "e-l"))
    await close(again)
    assert after.status == 429 and after.body["error"]["code"] == "rate_limited", after.body
    assert len(ledgers.ledgers()) == 3


# ---- (5) ----

async def test_a_pending_entry_whose_key_another_run_holds_is_not_undone_twice(
        ledgers: Ledgers, tmp_path: Path) -> None:
    """(a) A global key: run A charges order 42; run B's gateway writes its pending entry,
    finds the key held by run A, and is killed. Rolling B back must not find A's charge and
    refund it: the key's lock names run A, so B's call never ran. A's rollback refunds once."""
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests)
        made = await gw.call(call("once.pay", PAY, "run-a", "a-1"))
        assert made.status == 200, made.body
        assert (await gw.call(call("once.get_charge", {"charge_id": "none"}, "run-b", "b-0"))).status in (200, 502)
        await close(gw)
        ledgers.add_pending("run-b", killed_write_ahead(manifests, "b-1", PAY))
        await ledgers.roll_back("run-b", manifests)
        await ledgers.roll_back("run-a", manifests)
        charge = made.body
        assert up.refunds(charge["id"]) == 1
        assert ledgers.entries("run-a")["a-1"].state == "undone"
        never = ledgers.entries("run-b")["b-1"]  # never ran: skipped, and recorded as its gateway would have
        assert never.state == "refused" and never.error is not None and never.error.code == "duplicate"
        assert never.error.message.startswith("recorded by the rollback: entry a-1 of run run-a holds its "
                                              "idempotency key 'pay-42'")


async def test_a_lost_refusal_beside_an_uncertain_call_is_not_undone_twice(
        ledgers: Ledgers, tmp_path: Path) -> None:
    """(b) A call whose answer was lost (uncertain), the agent's repeat refused as a
    duplicate, and the refusal lost (the pending line synced, the refusal not): the
    rollback looks up the uncertain one and refunds its charge once; the repeat, whose key
    was held by an uncertain entry, never ran."""
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests)
        up.behaviour["charges.create"] = {"mode": "drop"}  # applied, and the answer lost
        lost = await gw.call(call("once.pay", PAY, "run-1", "x-1"))
        up.behaviour.clear()
        await close(gw)
        assert lost.status == 502, lost.body
        assert ledgers.entries("run-1")["x-1"].state == "uncertain"
        ledgers.add_pending("run-1", killed_write_ahead(manifests, "y-1", PAY))
        await ledgers.roll_back("run-1", manifests)
        [charge] = charges_of(up, "42")
        assert up.refunds(charge["id"]) == 1
        entries = ledgers.entries("run-1")
        assert (entries["x-1"].state, entries["y-1"].state) == ("undone", "refused")


def test_the_fixture_of_a_killed_write_ahead_is_what_a_gateway_writes(tmp_path: Path) -> None:
    """The hand-made pending entry of (5) holds what the gateway's own write-ahead holds
    (tool, key, scope, checksum, the arguments' handle), so the planner sees the same."""
    manifests = tools(tmp_path, "http://127.0.0.1:9")
    entry = killed_write_ahead(manifests, "b-1", PAY)
    m = load_versions([str(manifests)]).tools["once.pay"]
    assert (entry.key, entry.scope, entry.checksum) == ("pay-42", "global", checksum(m))
    assert entry.handle == Handle.model_validate(build_handle(m, PAY, {}).model_dump())
