"""What the fence, the held keys and the compare-and-set mean for an agent, in both stores."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from unwind.ledger.entry import Entry
from unwind.ledger.lifecycle import Expect, Write
from unwind.ledger.plan import Selection
from unwind.undo.local import execute, open_ledger, plan_local
from unwind.undo.sources import load_versions
from unwind.upstream.secrets import LocalSecrets

from .harness import Cluster, Folder, Ledgers, call, close, serving, tools
from .test_known_breaks import PAY


@pytest.fixture(params=["folder", "cluster"])
def ledgers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Ledgers]:
    yield Folder(tmp_path / "ledger") if request.param == "folder" else Cluster()


def found(e: Entry) -> Entry:
    return e.model_copy(update={"state": "succeeded", "warnings": ["found by its lookup"]})


async def test_an_outcome_that_finds_its_entry_taken_by_a_rollback_keeps_the_key_and_answers_502(
        ledgers: Ledgers, tmp_path: Path) -> None:
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests)
        gate = up.gate("charges.create")
        flying = asyncio.ensure_future(gw.call(call("once.pay", PAY, "run-1", "pay-1")))
        await gate.arrived.wait()
        # a rollback's lookup, long after (a call that outlived its deadline), took the entry
        later = datetime.now(UTC) + timedelta(hours=1)
        taker = ledgers.gateway(manifests)
        await taker.store.transition("run-1", "pay-1", Write("lookup", Expect("pending"), found, now=later))
        gate.release.set()
        result = await flying
        await close(gw, taker)
        assert result.status == 502, result.body
        error = result.body["error"]
        assert error["code"] == "upstream_error" and error["taken_by"] == "rollback"
        assert error["entry_state"] == "succeeded"
        assert "a rollback took entry pay-1 of run run-1 while its call was in flight" in error["message"]
        entry = ledgers.entries("run-1")["pay-1"]
        assert entry.state == "succeeded" and entry.warnings == ["found by its lookup"]  # not overwritten
        holder = ledgers.lock("run-1", "once.pay", "pay-42")
        assert holder is not None and (holder.run, holder.entry) == ("run-1", "pay-1")  # the key stays taken


async def test_after_the_fence_a_call_is_refused_naming_the_rollback_and_nothing_is_called(
        ledgers: Ledgers, tmp_path: Path) -> None:
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests)
        assert (await gw.call(call("once.pay", PAY, "run-1", "pay-1"))).status == 200
        await ledgers.roll_back("run-1", manifests)
        before = up.counts["charges.create"]
        after = await gw.call(call("once.pay", {"order_id": "43", "amount": 1}, "run-1", "pay-2"))
        elsewhere = await gw.call(call("once.pay", {"order_id": "43", "amount": 1}, "run-2", "pay-2"))
        await close(gw)
        assert after.status == 409 and after.body["error"]["code"] == "rolled_back", after.body
        assert "run run-1 is being rolled back" in after.body["error"]["message"]
        assert "Start a new run" in after.body["error"]["message"]
        assert after.body["error"]["run"] == "run-1" and after.body["error"]["fence"]["since"]
        assert up.counts["charges.create"] == before + 1  # only the call in the new run
        assert elsewhere.status == 200, elsewhere.body
        assert "pay-2" not in ledgers.entries("run-1")  # the refusal is not written there


async def test_a_rollback_denies_what_awaits_approval_so_its_repeat_never_runs_and_its_key_is_free(
        ledgers: Ledgers, tmp_path: Path) -> None:
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        gw = ledgers.gateway(manifests)
        args = {"order_id": "8", "amount": 5}
        assert (await gw.call(call("once.pay_approved", args, "run-1", "a-1"))).status == 428
        assert (await gw.call(call("once.pay", PAY, "run-1", "pay-1"))).status == 200
        await ledgers.roll_back("run-1", manifests)
        entry = ledgers.entries("run-1")["a-1"]
        assert entry.state == "denied" and entry.error is not None and entry.error.code == "rolled_back"
        repeat = await gw.call(call("once.pay_approved", args, "run-1", "a-1"))
        assert repeat.status == 403 and repeat.body["error"]["code"] == "denied", repeat.body
        # the key is free again: the same order, in a new run, waits for its own approval
        other = await gw.call(call("once.pay_approved", args, "run-2", "a-9"))
        await close(gw)
        assert other.status == 428, other.body
        assert up.effects["charges.create"] == 1  # only pay-1 ever ran


async def test_unwind_rollback_says_what_it_waits_for_while_a_call_is_in_flight(tmp_path: Path) -> None:
    folder = Folder(tmp_path / "ledger")
    async with serving() as (up, base):
        manifests = tools(tmp_path, base)
        gw = folder.gateway(manifests)
        gate = up.gate("charges.create")
        flying = asyncio.ensure_future(gw.call(call("once.pay", PAY, "run-1", "pay-1")))
        await gate.arrived.wait()
        ledger = open_ledger(folder.root / "run-1.json")
        versions = load_versions([str(manifests)])
        said: list[str] = []
        plan = plan_local(ledger, versions, Selection())
        rolling = asyncio.ensure_future(execute(ledger, plan, versions, Selection(), by="oncall",
                                                secrets=LocalSecrets(), report=lambda s, r: None,
                                                say=said.append))
        await asyncio.sleep(0.3)
        assert len(said) == 1 and said[0].startswith(
            "run run-1 is closed to new calls; waiting for 1 call in flight to finish (pay-1; until ")
        assert not rolling.done()
        gate.release.set()
        assert (await flying).status == 200
        summary = await rolling
        await close(gw)
        assert summary.ok and said[1:] == [
            "the calls in flight are over: planning",
            "the run changed since the plan was shown: planned again, 1 step to run (the plan "
            "shown had 1)"]
        assert folder.entries("run-1")["pay-1"].state == "undone"

