"""The exactly-once protocol under a seeded simulation (issue 26, item 5; docs/rollback.md,
"What Unwind guarantees, and under which faults").

The thousand seeds and the four scenarios fail on today's code, each for a known bug of
issue 26: they are strict xfails, so the run stays green and an xfail that starts passing
(the state machine landed) fails the run until its mark is removed. ``UNWIND_SIM_SEED=N``
runs only seed N; ``UNWIND_SIM_SEEDS=N`` runs N seeds instead of 1000.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from tests.sim import actors
from tests.sim.__main__ import report
from tests.sim.run import Driver, Intent, run
from tests.sim.world import Script

KNOWN_BUGS = ("issue 26: (1) a rollback during a call is overwritten by the call's outcome, "
              "(2) two approved repeats of one key both run, (3) a slow capture loses its key "
              "lock, (5) one effect undone twice through the plan's skip rule; and two the "
              "simulation found: an uncertain irreversible entry is never looked up (stuck, "
              "its key held for good: seed 6), and one Idempotency-Key repeated during a slow "
              "write-ahead runs on the first's lock, which the first then releases (seed 624)")


def test_a_seed_replays_exactly() -> None:
    first, again = run(6), run(6)
    assert first.trace == again.trace and first.breaches == again.breaches
    assert first.steps == again.steps
    assert run(7).trace != first.trace


async def _one_of_each(d: Driver) -> None:
    """Each tool once, sequentially, an approval between; no fault, nothing concurrent."""
    d.start()
    calls = [Intent("run-a", "e1", "pay.charge", {"order": 1, "amount": 5}),
             Intent("run-a", "e2", "box.create", {"name": "run-a-x"}),
             Intent("run-b", "e3", "cfg.set", {"id": "run-b-1", "value": "v3"}),
             Intent("run-b", "e4", "vault.wire", {"order": 1, "amount": 100})]
    for intent in calls:
        d.agent.send(d.agent._new(intent))
        await asyncio.sleep(15)
    await d.world.loop.spawn("approver.1", actors.approve(d.world, "run-b", "e4", 1))
    d.agent.send(calls[-1])
    await asyncio.sleep(15)


@pytest.mark.parametrize("kind", ["file", "cluster"])
def test_calls_without_faults_or_concurrency_keep_every_invariant(kind: str) -> None:
    result = run(1, kind=kind, body=_one_of_each)
    assert result.ok, report(result)
    assert sum("upstream vault.wire" in line for line in result.trace) == 1
    assert sum("upstream pay.refund" in line for line in result.trace) == 1  # the final rollback


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN_BUGS)
def test_a_thousand_seeds_keep_every_invariant() -> None:
    only = os.environ.get("UNWIND_SIM_SEED")
    for seed in [int(only)] if only else range(int(os.environ.get("UNWIND_SIM_SEEDS", "1000"))):
        result = run(seed)
        assert result.ok, report(result)


async def _rollback_during_a_call(d: Driver) -> None:
    d.start()
    d.agent.send(d.agent._new(Intent("run-a", "e1", "pay.charge", {"order": 1, "amount": 5})))
    await asyncio.sleep(1)  # the charge is on its way: it lands at 5 s, its answer at 6 s
    w = d.world
    await w.loop.spawn("rollback.1", actors.local_rollback(w, "run-a", "rollback.1"))
    await asyncio.sleep(10)
    d.agent.send(d.agent._new(Intent("run-a", "e2", "pay.charge", {"order": 1, "amount": 5})))
    await asyncio.sleep(10)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="issue 26 (1): the lookup finds "
                   "nothing yet, frees the key, and the call's outcome write says succeeded")
def test_a_rollback_during_a_call_is_not_overwritten_by_the_calls_outcome() -> None:
    result = run(1, kind="file", body=_rollback_during_a_call,
                 script=Script(upstream={"pay.charge": (5.0, 1.0)}))
    assert result.ok, report(result)


async def _approved_repeats(d: Driver) -> None:
    d.start()
    w = d.world
    first = d.agent._new(Intent("run-a", "e1", "vault.wire", {"order": 1, "amount": 100}))
    second = d.agent._new(Intent("run-a", "e2", "vault.wire", {"order": 1, "amount": 100}))
    for intent in (first, second):  # both wait for approval (428): an awaiting entry holds no key
        d.agent.send(intent)
    await asyncio.sleep(1)
    for n, intent in enumerate((first, second), 1):
        await w.loop.spawn(f"approver.{n}", actors.approve(w, "run-a", intent.entry, n))
    for intent in (first, second):  # and the agent repeats both at once
        d.agent.send(intent)
    await asyncio.sleep(20)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="issue 26 (2): the second repeat "
                   "breaks the first's lock, whose entry still reads awaiting_approval")
def test_two_approved_repeats_of_one_key_run_once() -> None:
    result = run(1, kind="file", body=_approved_repeats)
    assert result.ok, report(result)


async def _slow_capture(d: Driver) -> None:
    d.start()
    d.agent.send(d.agent._new(Intent("run-a", "e1", "cfg.set", {"id": "run-a-1", "value": "v1"})))
    await asyncio.sleep(31)  # its capture still reads; the lock is older than lock_grace
    # the same call again under a new Idempotency-Key: a retry that lost the first's
    d.agent.send(d.agent._new(Intent("run-a", "e2", "cfg.set", {"id": "run-a-1", "value": "v1"})))
    await asyncio.sleep(80)


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="issue 26 (3): a lock older than "
                   "lock_grace whose entry is not written yet is broken as stale")
def test_a_slow_capture_keeps_its_key_lock() -> None:
    result = run(1, kind="file", body=_slow_capture,
                 script=Script(upstream={"cfg.read": (35.0, 0.5)}))
    assert result.ok, report(result)


async def _killed_duplicate(d: Driver) -> None:
    d.start()
    w = d.world
    d.agent.send(d.agent._new(Intent("run-a", "e1", "pay.charge", {"order": 42, "amount": 5})))
    await asyncio.sleep(5)
    d.agent.send(d.agent._new(Intent("run-b", "e2", "pay.charge", {"order": 42, "amount": 5})))
    await asyncio.sleep(2)  # its pending entry is written, its refusal write is under way
    proc = d.agent.tasks[-1][0]
    next(g for g in d.gateways if g.proc == proc).kill()
    await w.loop.spawn("rollback.1", actors.local_rollback(w, "run-b", "rollback.1"))
    await w.loop.spawn("rollback.2", actors.local_rollback(w, "run-a", "rollback.2"))


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="issue 26 (5): run B's pending "
                   "entry is looked up by its key, finds run A's charge, and both refund it")
def test_one_effect_is_undone_once_when_a_killed_duplicates_entry_is_rolled_back() -> None:
    result = run(1, kind="file", body=_killed_duplicate,
                 script=Script(store={"update run-b/e2": 30.0}))
    assert result.ok, report(result)
