"""The entry lifecycle (ledger/lifecycle.py): every writer, every transition, the illegal ones
refused, the compare-and-set, the fence, and the documentation's one table."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.fake_apiserver import FakeApiServer
from unwind.ledger import lifecycle
from unwind.ledger.clusterstore import ClusterStore
from unwind.ledger.entry import STATES, Attempt, Entry, State, Times, stamp
from unwind.ledger.fence import Fence, Fenced
from unwind.ledger.filestore import FileStore
from unwind.ledger.lifecycle import (
    HOLDING,
    STATE_INFO,
    TRANSITIONS,
    WRITERS,
    Expect,
    IllegalTransition,
    StaleWrite,
    Write,
)
from unwind.ledger.memory import MemoryStore
from unwind.ledger.plan import _HELD_KEY

ROOT = Path(__file__).resolve().parents[2]
NS = "agents"  # the fake API server's namespace
T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def entry(state: State = "pending", id_: str = "e-1", **kw: Any) -> Entry:
    return Entry(id=id_, tool="t", actor="me", state=state, key="k-1", scope="run",
                 times=Times(requested=stamp(T0)), **kw)


def to(state: State) -> Any:
    return lambda e: e.model_copy(update={"state": state})


def test_each_writer_may_make_exactly_the_transitions_its_rows_name() -> None:
    for source, target, writer in itertools.product(STATES, STATES, WRITERS):
        row = lifecycle.find(source, target, writer)
        write = Write(writer, Expect(source), to(target), now=T0 + timedelta(days=1))
        if row is None:
            with pytest.raises(IllegalTransition, match=rf"the {writer} may not move it from "
                                                        rf"{source} to {target}"):
                write(entry(source))
        else:
            assert write(entry(source)).state == target


def test_the_gateway_creates_pending_awaiting_or_refused_entries_and_nobody_creates_others() -> None:
    created = {(t.target, w) for t in TRANSITIONS if t.source is None for w in t.writers}
    assert created == {("pending", "gateway"), ("awaiting_approval", "gateway"), ("refused", "gateway")}
    for state in STATES:
        if (state, "gateway") in created:
            assert lifecycle.admit(entry(state)).target == state
        else:
            with pytest.raises(IllegalTransition, match=f"may not create an entry {state}"):
                lifecycle.admit(entry(state))


def test_every_state_is_reached_by_some_writer_from_a_new_call() -> None:
    reached: set[State | None] = {None}
    while True:
        more = {t.target for t in TRANSITIONS if t.source in reached} - reached
        if not more:
            break
        reached |= more
    assert reached - {None} == set(STATES)


def test_nothing_moves_an_entry_out_of_undone_or_denied() -> None:
    # what a rollback finished, and what a human refused, stay as they are
    assert not [t for t in TRANSITIONS if t.source in ("undone", "denied")]


def test_only_a_rollback_a_lookup_or_a_person_changes_an_entry_whose_call_ended() -> None:
    for t in TRANSITIONS:
        if t.source in ("succeeded", "uncertain", "undoing", "undo_failed"):
            if t.writers == {"gateway"}:  # only to record its own read after the call
                assert (t.source, t.target) == ("succeeded", "succeeded"), t
                continue
            assert t.writers <= {"rollback", "lookup", "person"}, t


def test_a_person_only_settles_and_nobody_moves_a_settled_or_moot_entry() -> None:
    assert {t.target for t in TRANSITIONS if "person" in t.writers} == {"settled"}
    assert all(t.writers == {"person"} for t in TRANSITIONS if t.target == "settled")
    assert not [t for t in TRANSITIONS if t.source in ("settled", "moot")]
    assert {t.source for t in TRANSITIONS if t.target == "moot"} == {
        "succeeded", "undo_failed", "undoing"}


def test_the_key_effect_of_each_row_is_what_its_states_say_and_a_wrong_row_fails_at_import(
        monkeypatch: pytest.MonkeyPatch) -> None:
    holds = {s.name: s.holds_key for s in STATE_INFO}
    for t in TRANSITIONS:
        before = t.source is not None and holds[t.source]
        assert t.key == {(False, True): "take", (True, True): "hold", (True, False): "free",
                         (False, False): "none"}[(before, holds[t.target])]
    assert {"awaiting_approval", "pending", "succeeded", "uncertain", "undoing",
                       "undo_failed", "settled"} == HOLDING
    wrong = lifecycle._t("pending", "failed", "gateway", "hold", "a row that says the wrong thing")
    monkeypatch.setattr(lifecycle, "TRANSITIONS", (*TRANSITIONS, wrong))
    with pytest.raises(AssertionError, match="pending -> failed"):
        lifecycle._check_table()


def test_the_planners_holding_states_are_the_lifecycles_but_pending() -> None:
    assert HOLDING - {"pending"} == _HELD_KEY


def test_a_write_whose_expected_state_is_gone_names_the_entry_the_states_and_the_writer() -> None:
    outcome = Write("gateway", Expect("pending"), to("succeeded"))
    with pytest.raises(StaleWrite) as caught:
        outcome(entry("undone"))
    assert str(caught.value) == ("entry e-1 is undone, not pending as the gateway read it: another "
                                 "writer changed it since, and nothing overwrites that")
    assert (caught.value.entry, caught.value.found, caught.value.expected,
            caught.value.writer) == ("e-1", "undone", "pending", "gateway")


def test_a_write_meant_for_an_earlier_attempt_does_not_land_on_the_next_one() -> None:
    reused = entry("pending", attempts=[Attempt(state="failed")])
    old = Write("gateway", Expect("pending", attempt=0), to("succeeded"))
    with pytest.raises(StaleWrite, match=r"is pending \(attempt 2\), not pending \(attempt 1\)"):
        old(reused)
    assert Write("gateway", Expect.of(reused), to("succeeded"))(reused).state == "succeeded"


def test_a_lookup_leaves_a_pending_entry_alone_until_its_call_can_no_longer_be_in_flight() -> None:
    flying = entry("pending", deadline=stamp(T0 + timedelta(seconds=30)))
    found = Write("lookup", Expect("pending"), to("succeeded"), now=T0 + timedelta(seconds=29))
    with pytest.raises(StaleWrite, match="may still be in flight"):
        found(flying)
    late = Write("lookup", Expect("pending"), to("succeeded"), now=T0 + timedelta(seconds=31))
    assert late(flying).state == "succeeded"
    # an uncertain entry's call is over: its lookup needs no deadline
    assert Write("lookup", Expect("uncertain"), to("failed"))(entry("uncertain")).state == "failed"
    # an entry written before deadlines were recorded has none: it counts as past
    assert Write("lookup", Expect("pending"), to("failed"))(entry("pending")).state == "failed"


def test_writes_one_after_the_other_are_each_checked_against_what_the_previous_left() -> None:
    both = Write("rollback", Expect("succeeded"), to("undoing")).then(
        Write("rollback", Expect("undoing"), to("undone")))
    assert both(entry("succeeded")).state == "undone"
    with pytest.raises(StaleWrite):
        both(entry("undo_failed"))


def test_only_the_gateways_rows_that_start_a_call_are_refused_in_a_fenced_run() -> None:
    opening = {(t.source, t.target) for t in TRANSITIONS if t.opens}
    assert opening == {(None, "pending"), (None, "awaiting_approval"), ("failed", "pending"),
                       ("refused", "pending"), ("failed", "awaiting_approval"),
                       ("refused", "awaiting_approval"), ("awaiting_approval", "pending")}
    assert all(t.writers == {"gateway"} for t in TRANSITIONS if t.opens)


# ---- the stores apply it ----

FENCE = Fence(since="2026-03-01T10:00:00.000Z", by="oncall", reason="stop it")


async def test_the_memory_store_writes_through_the_lifecycle_and_honours_the_fence() -> None:
    store = MemoryStore()
    await store.create("run-1", entry("pending"))
    await store.create("run-1", entry("pending", "e-2"))
    await store.transition("run-1", "e-2", Write("gateway", Expect("pending"), to("failed")))
    with pytest.raises(IllegalTransition):
        await store.create("run-1", entry("succeeded", "e-3"))
    await store.fence("run-1", FENCE)
    with pytest.raises(Fenced, match="run run-1 is being rolled back: a rollback by oncall"):
        await store.create("run-1", entry("pending", "e-4"))
    with pytest.raises(Fenced):  # a reused id would start a call too
        await store.transition("run-1", "e-2", Write("gateway", Expect("failed"), to("pending")))
    await store.create("run-1", entry("refused", "e-5"))  # a refusal starts nothing
    done = await store.transition("run-1", "e-1", Write("gateway", Expect("pending"), to("succeeded")))
    assert done.state == "succeeded"  # the call in flight records its outcome


def test_the_file_store_writes_through_the_lifecycle_and_its_fence_is_seen_by_another_process(
        tmp_path: Path) -> None:
    gateway, rollback = FileStore(tmp_path), FileStore(tmp_path)
    gateway.create_sync("run-1", entry("pending"))
    with pytest.raises(StaleWrite):
        gateway.transition_sync("run-1", "e-1", Write("gateway", Expect("uncertain"), to("succeeded")))
    assert rollback.fence_sync("run-1", FENCE) == FENCE
    assert rollback.fence_sync("run-1", FENCE.model_copy(update={"by": "later"})) == FENCE  # the first stays
    with pytest.raises(Fenced, match="a rollback by oncall"):
        gateway.create_sync("run-1", entry("pending", "e-2"))
    gateway.transition_sync("run-1", "e-1", Write("gateway", Expect("pending"), to("succeeded")))
    assert FileStore(tmp_path).fenced_sync("run-1") == FENCE


async def test_a_cluster_stores_retry_after_a_conflict_checks_the_expectation_again() -> None:
    """The gateway's outcome write meets a 409 because a rollback wrote the entry meanwhile:
    the store reads the page again and the write, checked on the fresh entry, fails; it is
    never applied blindly over the rollback's."""
    server = FakeApiServer(delay=0)
    store = ClusterStore(server.client(), NS)
    await store.create("run-1", entry("pending"))
    page = server.ledger("run-1")
    assert page is not None
    page["status"]["entries"][0]["state"] = "undoing"  # the operator's write, unseen by the store
    page["metadata"]["resourceVersion"] = server._next_rv()
    with pytest.raises(StaleWrite, match="entry e-1 is undoing, not pending as the gateway read it"):
        await store.transition("run-1", "e-1", Write("gateway", Expect("pending"), to("succeeded")))
    assert server.entries("run-1")[0].state == "undoing"


async def test_a_rollback_request_fences_the_page_it_is_on_in_the_gateways_next_write() -> None:
    server = FakeApiServer(delay=0)
    store = ClusterStore(server.client(), NS)
    await store.create("run-1", entry("pending"))
    page = server.ledger("run-1")
    assert page is not None
    page["spec"]["rollback"] = {"requested": True, "reason": "stop it",
                                "requestedAt": "2026-03-01T10:01:00.000Z"}
    page["metadata"]["resourceVersion"] = server._next_rv()
    with pytest.raises(Fenced, match=r"\(stop it\) closed it to new calls at 2026-03-01T10:01:00.000Z"):
        await store.create("run-1", entry("pending", "e-2"))
    done = await store.transition("run-1", "e-1", Write("gateway", Expect("pending"), to("succeeded")))
    assert done.state == "succeeded"


async def test_the_operators_fence_on_a_later_page_fences_a_write_to_that_page() -> None:
    server = FakeApiServer(delay=0)
    store = ClusterStore(server.client(), NS, page_bytes=300)
    for n in range(6):
        await store.create("run-1", entry("pending", f"e-{n}"))
    tail = [name for (kind, name) in server.objects if kind == "effectledgers"][-1]
    assert tail != "run-1"
    obj = server.ledger(tail)
    assert obj is not None
    obj["status"]["fence"] = FENCE.to_json()
    obj["metadata"]["resourceVersion"] = server._next_rv()
    with pytest.raises(Fenced):
        await store.create("run-1", entry("pending", "e-9"))


# ---- the documentation's one table ----

def test_docs_rollback_md_shows_the_lifecycle_table_as_the_code_has_it() -> None:
    text = (ROOT / "docs" / "rollback.md").read_text()
    found = re.search(r"<!-- lifecycle table: begin.*?-->\n(.*?)<!-- lifecycle table: end -->", text, re.S)
    assert found, "docs/rollback.md has no lifecycle table between its markers"
    assert found.group(1) == lifecycle.markdown(), (
        "docs/rollback.md's lifecycle table differs from ledger/lifecycle.py: paste "
        "`python -c 'from unwind.ledger.lifecycle import markdown; print(markdown(), end=\"\")'`")


def test_docs_gateway_md_points_at_that_table_and_keeps_no_other() -> None:
    text = (ROOT / "docs" / "gateway.md").read_text()
    assert "rollback.md#the-entry-lifecycle" in text
    assert "| from | to | who | key | when |" not in text
