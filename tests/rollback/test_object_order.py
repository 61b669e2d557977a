"""Order by object (issue 27.1): undos of one object run newest first, one at a time; moot
steps; and the property that any run of creates, updates and deletes, rolled back by the
operator with any parallelism and its Jobs finishing in any order, ends in the state before
the run, revisions and all (the store refuses a stale revision, as CouchDB does)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.rollback.revisions import T0, VERSIONS, Docs, DocsUpstream, record
from unwind.ledger.plan import make_plan
from unwind.ledger.stepinput import StepInput
from unwind.operator.rollback import Context, JobView, LedgerView, decide
from unwind.undo.runner import run_step
from unwind.upstream.secrets import LocalSecrets

IDS = ("a", "b", "c")
NOW = T0 + timedelta(hours=1)


def run_ops(start: dict[str, str], wanted: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    """The drawn operations that make sense in order (create what is absent, update or
    delete what is there)."""
    there = set(start)
    ops = []
    for kind, doc_id, title in wanted:
        if (kind == "create") == (doc_id in there):
            continue
        ops.append((kind, doc_id, title))
        if kind == "create":
            there.add(doc_id)
        elif kind == "delete":
            there.discard(doc_id)
    return ops


def seeded(start: dict[str, str]) -> Docs:
    docs = Docs()
    for doc_id, title in start.items():
        docs.handle("docs.create", doc_id, {"title": title}, {})
    return docs


def roll_back(docs: Docs, entries: list[Any], parallelism: int, pick: Any) -> LedgerView:
    """The operator's rollback of ``entries``: each pass decided by ``rollback.decide``;
    ``pick`` chooses which running Job finishes next (any order)."""
    view = LedgerView("run-1", "uid-1", "run-1", 2, {"requested": True, "reason": "test"},
                      None, [], entries)
    jobs: dict[str, JobView] = {}
    inputs: dict[str, StepInput] = {}
    upstream = DocsUpstream(docs)
    now = NOW
    for _ in range(400):
        d = decide(view, lambda: VERSIONS, jobs, {}, Context("ns", now, "img", parallelism))
        view.entries = [d.changes[e.id](e) if e.id in d.changes else e for e in view.entries]
        view.rollback = d.status.get("rollback", view.rollback)
        view.conditions = d.status.get("conditions", view.conditions)
        view.history = d.status.get("rollbacks", view.history)
        for body in d.jobs:
            name = body["metadata"]["name"]
            env = body["spec"]["template"]["spec"]["containers"][0]["env"]
            text = next(e["value"] for e in env if e["name"] == "UNWIND_STEP")
            inputs[name] = StepInput.model_validate(json.loads(text))
            jobs.setdefault(name, JobView(name, "running"))
        running = [n for n, j in jobs.items() if j.phase == "running"]
        if view.rollback and view.rollback.get("finished"):
            return view
        assert running, f"nothing runs and the rollback is not finished: {view.rollback}"
        name = pick(sorted(running))
        result = asyncio.run(run_step(inputs[name], upstream, LocalSecrets(None)))
        jobs[name] = JobView(name, "succeeded" if result["ok"] else "failed", json.dumps(result))
        now += timedelta(seconds=1)
    raise AssertionError("the rollback did not finish in 400 passes")


OPS = st.lists(st.tuples(st.sampled_from(("create", "update", "delete")), st.sampled_from(IDS),
                         st.sampled_from(("x", "y", "z"))), min_size=1, max_size=10)
START = st.dictionaries(st.sampled_from(IDS), st.sampled_from(("old", "older")), max_size=3)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(start=START, wanted=OPS, parallelism=st.integers(1, 4), data=st.data())
def test_any_run_rolled_back_with_any_parallelism_in_any_order_ends_in_the_state_before_it(
        start: dict[str, str], wanted: list[tuple[str, str, str]], parallelism: int,
        data: st.DataObject) -> None:
    ops = run_ops(start, wanted)
    if not ops:
        return
    docs = seeded(start)
    before = docs.state()
    # each call's clock: two gateways may disagree with the order the calls were made in
    clocks = data.draw(st.lists(st.integers(0, 30), min_size=len(ops), max_size=len(ops)))
    entries = record(docs, ops, clocks)
    view = roll_back(docs, entries, parallelism, lambda names: data.draw(st.sampled_from(names)))
    steps = view.rollback["steps"]  # type: ignore[index]
    assert [s for s in steps if s["state"] not in ("succeeded", "moot")] == [], steps
    assert docs.state() == before
    rolled = next(c for c in view.conditions if c["type"] == "RolledBack")
    assert rolled["status"] == "True", rolled


def test_a_create_then_update_is_undone_update_first_even_when_the_clocks_say_otherwise() -> None:
    docs = Docs()
    entries = record(docs, [("create", "a", "x"), ("update", "a", "y")], clocks=[20, 10])
    plan = make_plan("run-1", entries, VERSIONS, now=NOW)
    assert [(s.entry, s.action) for s in plan.steps] == [("e-2", "inverse"), ("e-1", "inverse")]
    assert plan.steps[0].object == plan.steps[1].object == '{"id":"a"}'


def test_steps_on_one_object_never_run_at_once_and_steps_on_others_do() -> None:
    docs = seeded({"b": "old"})
    entries = record(docs, [("create", "a", "x"), ("update", "a", "y"), ("update", "b", "z")],
                     clocks=[0, 1, 2])
    view = LedgerView("run-1", "uid-1", "run-1", 2, {"requested": True}, None, [], entries)
    d = decide(view, lambda: VERSIONS, {}, {}, Context("ns", NOW, "img", 4))
    started = {s["entry"] for s in d.status["rollback"]["steps"] if s["state"] == "running"}
    assert started == {"e-3", "e-2"}  # e-1 (the create of a) waits for e-2 (its update)


def test_the_plan_reads_the_revision_right_before_the_undo_and_sends_it_as_if_match() -> None:
    docs = Docs()
    entries = record(docs, [("create", "a", "x")], clocks=[0])
    [step] = make_plan("run-1", entries, VERSIONS, now=NOW).steps
    assert step.to_json()["read_before"] == {"tool": "docs.get", "arguments": {"id": "a"},
                                             "binds": {"headers.If-Match": "$current._rev"}}
    assert "right before the undo docs.get reads the object as it is now" in step.reason


def test_an_update_whose_answer_holds_no_fields_is_checked_against_the_read_after_the_call() -> None:
    docs = seeded({"a": "old"})
    entries = record(docs, [("update", "a", "new")], clocks=[0])
    assert entries[0].handle is not None and entries[0].handle.after == {"title": "new"}
    [step] = make_plan("run-1", entries, VERSIONS, now=NOW).steps
    assert step.verification is not None and step.verification.left == {"title": "new"}
    assert "still holds what the read right after the call found" in step.reason
    docs.docs["a"]["title"] = "changed by someone"  # a real later change is still caught
    view = roll_back(docs, entries, 1, lambda names: names[0])
    [s] = view.rollback["steps"]  # type: ignore[index]
    assert s["state"] == "failed" and s["outcome"] == "diverged"
    assert docs.state() == {"a": "changed by someone"}


def test_a_delete_without_a_read_after_the_call_says_there_is_no_divergence_check() -> None:
    docs = seeded({"a": "old"})
    entries = record(docs, [("delete", "a", "")], clocks=[0])
    [step] = make_plan("run-1", entries, VERSIONS, now=NOW).steps
    assert "no divergence check: the call's answer holds none of the expect paths" in step.reason


def test_an_update_whose_created_object_an_earlier_rollback_removed_is_moot_not_failed() -> None:
    docs = Docs()
    entries = record(docs, [("create", "a", "x"), ("update", "a", "y")], clocks=[0, 1])
    # an earlier rollback undid the create (the object is gone) and failed the update
    docs.docs.clear()
    entries[0] = entries[0].model_copy(update={"state": "undone"})
    entries[1] = entries[1].model_copy(update={"state": "undo_failed"})
    plan = make_plan("run-1", entries, VERSIONS, now=NOW)
    moot = next(s for s in plan.steps if s.entry == "e-2")
    assert moot.action == "moot"
    assert moot.reason.startswith('moot: its object ({"id":"a"}) was removed by the undo of '
                                  "entry e-1 (docs.create)")
    view = roll_back(docs, entries, 4, lambda names: names[0])
    [s] = [s for s in view.rollback["steps"] if s["entry"] == "e-2"]  # type: ignore[index]
    assert s["state"] == "moot"
    e2 = next(e for e in view.entries if e.id == "e-2")
    assert e2.state == "moot" and e2.undo is not None and e2.undo["reason"] == moot.reason
    assert next(c for c in view.conditions if c["type"] == "RolledBack")["status"] == "True"
    assert docs.state() == {}
