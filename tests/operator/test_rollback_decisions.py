"""The cluster rollback's decisions, without a cluster: ledger, Jobs and clock in; status,
entry changes, Jobs and Events out (operator/unwind/operator/rollback.py)."""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from unwind.ledger.entry import ApprovalDecision, Entry, Handle, Staged, Times, stamp
from unwind.ledger.handle import build_handle
from unwind.ledger.plan import Versions
from unwind.ledger.store import Stale
from unwind.manifest.canonical import checksum
from unwind.operator.rollback import Context, Decision, JobView, LedgerView, decide
from unwind.operator.undojob import (
    MAX_STEP_BYTES,
    job_body,
    job_name,
    label_value,
    ledger_of_job,
    lookup_job_name,
)
from unwind.undo.sources import load_versions

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
UID = "0f5c2a9e-0000-4000-8000-000000000001"


@pytest.fixture(scope="module")
def versions() -> Versions:
    return load_versions([str(ROOT / "manifests"), str(ROOT / "tests/rollback/extra.yaml")])


def entry(versions: Versions, id_: str, tool: str, args: dict[str, Any], result: Any, seq: int, *,
          state: str = "succeeded", staged: bool = False, key: str | None = None) -> Entry:
    m = versions.tools[tool]
    when = stamp(NOW - timedelta(minutes=30 - seq))
    handle = build_handle(m, args, result, staged=staged)
    draft = None
    if staged:
        assert m.draft is not None
        draft = Staged(draft_tool=m.draft.tool, handle={"repo": args["repo"], "release_id": result["id"]},
                       promote=m.draft.promote, discard=m.draft.discard)
    return Entry(id=id_, seq=seq, tool=tool, checksum=checksum(m), effect=m.effect, actor="agent",
                 key=key, scope="run" if key else None, state=state,  # type: ignore[arg-type]
                 handle=handle, staged=draft, times=Times(requested=when, started=when, finished=when))


def story(versions: Versions) -> list[Entry]:
    return [
        entry(versions, "pay-1", "stripe.create_charge", {"order_id": "o1", "amount": 2500},
              {"id": "ch_1", "refunded": False}, 1, key="charge-o1"),
        entry(versions, "c-1", "github.create_comment", {"repo": "octo/hello", "issue": 7},
              {"id": 2}, 2),
        entry(versions, "i-1", "github.create_issue", {"repo": "octo/hello", "title": "t"},
              {"number": 3}, 3),
        entry(versions, "rel-1", "github.create_release", {"repo": "octo/hello", "tag": "v1"},
              {"id": 4}, 4, staged=True),
    ]


def ledger(entries: list[Entry], request: dict[str, Any] | None = None, rollback: Any = None,
           generation: int = 2, conditions: list[Any] | None = None) -> LedgerView:
    return LedgerView("run-42", UID, "run-42", generation,
                      request if request is not None else {"requested": True, "reason": "bad run"},
                      rollback, conditions or [], entries)


def ctx(now: datetime = NOW, parallelism: int = 1) -> Context:
    return Context("shop", now, "unwind:test", parallelism)


class World:
    """A ledger the decisions are applied to, as the operator's writes would."""

    def __init__(self, versions: Versions, entries: list[Entry], **kw: Any) -> None:
        self.versions = versions
        self.view = ledger(entries, **kw)
        self.jobs: dict[str, JobView] = {}
        self.created: list[dict[str, Any]] = []
        self.decisions: dict[str, list[ApprovalDecision]] = {}
        self.now = NOW

    def step(self, parallelism: int = 1) -> Decision:
        d = decide(self.view, lambda: self.versions, self.jobs, self.decisions, ctx(self.now, parallelism))
        entries = []
        for e in self.view.entries:
            change = d.changes.get(e.id)
            if change is not None:
                with contextlib.suppress(Stale):
                    e = change(e)
            entries.append(e)
        self.view.entries = entries
        if "rollback" in d.status:
            self.view.rollback = d.status["rollback"]
        if "conditions" in d.status:
            self.view.conditions = d.status["conditions"]
        if "live" in d.status:
            self.view.live = d.status["live"]
        if "rollbacks" in d.status:
            self.view.history = d.status["rollbacks"]
            self.view.dropped = d.status.get("rollbacksDropped", 0)
        for body in d.jobs:
            name = body["metadata"]["name"]
            if name not in self.jobs:
                self.created.append(body)
                self.jobs[name] = JobView(name, "running")
        self.now += timedelta(seconds=1)
        return d

    def finish(self, name: str, result: dict[str, Any], phase: str | None = None) -> None:
        self.jobs[name] = JobView(name, phase or ("succeeded" if result.get("ok") else "failed"),
                                  json.dumps(result))

    def entry(self, id_: str) -> Entry:
        return next(e for e in self.view.entries if e.id == id_)

    def condition(self, type_: str) -> dict[str, Any]:
        return next(c for c in self.view.conditions if c["type"] == type_)

    def steps(self) -> list[dict[str, Any]]:
        return list((self.view.rollback or {}).get("steps") or [])

    def step_input(self, body: dict[str, Any]) -> dict[str, Any]:
        env = body["spec"]["template"]["spec"]["containers"][0]["env"]
        return dict(json.loads(next(e["value"] for e in env if e["name"] == "UNWIND_STEP")))


def undone(step_input: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "outcome": "undone", "entry_state": "undone", "reason": "undone: read back",
            "entry": step_input["step"]["entry"], "finished": stamp(NOW)}


def test_a_request_freezes_the_plan_in_status_and_creates_the_first_steps_job(versions: Versions) -> None:
    w = World(versions, story(versions))
    d = w.step()
    rb = w.view.rollback
    assert rb["generation"] == 2 and rb["request"]["reason"] == "bad run"
    assert [(s["entry"], s["action"], s["state"]) for s in rb["steps"]] == [
        ("rel-1", "discard", "running"), ("i-1", "compensate", "pending"),
        ("c-1", "inverse", "pending"), ("pay-1", "compensate", "pending")]
    (job,) = d.jobs
    assert job["metadata"]["name"] == rb["steps"][0]["job"] == job_name("run-42", UID, 1, "rel-1", "discard", 2)
    assert w.entry("rel-1").state == "undoing"
    assert w.entry("rel-1").undo["job"] == job["metadata"]["name"]
    assert w.condition("RollbackPlanned")["status"] == "True"
    assert w.condition("RolledBack")["reason"] == "InProgress"
    assert [e.reason for e in d.events] == ["Planned"]


def test_the_frozen_plan_records_who_asked_and_the_planned_event_names_them(versions: Versions) -> None:
    w = World(versions, story(versions))
    w.view.requester = {"user": "alice", "groups": ["sre"]}
    d = w.step()
    assert w.view.rollback["requestedBy"] == {"user": "alice", "groups": ["sre"]}
    assert "requested by alice; reason: bad run" in d.events[0].message
    unknown = World(versions, story(versions))
    unknown.view.requester = {"problem": "no identity was recorded"}
    d = unknown.step()
    assert unknown.view.rollback["requestedBy"] == {"problem": "no identity was recorded"}
    assert "requested by" not in d.events[0].message  # still rolled back: an undo is never held up


def test_the_job_runs_undo_step_without_api_access_as_non_root_with_its_step_and_deadline(versions: Versions) -> None:
    w = World(versions, story(versions)[:1])
    (job,) = w.step().jobs
    pod = job["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["unwind", "undo-step"] and c["image"] == "unwind:test"
    assert pod["automountServiceAccountToken"] is False and pod["restartPolicy"] == "Never"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and c["securityContext"]["runAsNonRoot"]
    assert job["metadata"]["labels"]["unwind.dev/ledger"] == "run-42"
    assert job["metadata"]["labels"]["unwind.dev/entry"] == "pay-1"
    assert job["metadata"]["ownerReferences"][0]["kind"] == "EffectLedger"
    assert job["spec"]["backoffLimit"] == 1
    # stripe.refund: 20 s; the read-back: 3 attempts of 30 s, backoff 2 s + 4 s; start-up 30 s; two pods
    assert job["spec"]["activeDeadlineSeconds"] == (20 + 90 + 6 + 30) * 2 + 10
    data = w.step_input(job)
    assert data["idempotency_key"].startswith("unwind-compensate-")
    assert data["step"]["arguments"] == {"charge_id": "ch_1", "amount": 2500}


def test_steps_run_one_after_another_and_the_ledger_ends_rolled_back(versions: Versions) -> None:
    w = World(versions, story(versions))
    w.step()
    for _ in range(4):
        running = [s for s in w.steps() if s["state"] == "running"]
        assert len(running) == 1
        w.finish(running[0]["job"], undone(w.step_input(w.created[-1])))
        w.step()
    assert [s["state"] for s in w.steps()] == ["succeeded"] * 4
    assert {e.state for e in w.view.entries} == {"undone"}
    assert w.condition("RolledBack")["status"] == "True"
    assert w.condition("Degraded")["status"] == "False"
    assert w.view.rollback["finished"]
    assert len(w.created) == 4
    assert w.step().empty  # nothing more to do


def test_a_rollback_of_one_entry_does_not_read_rolled_back_while_the_runs_other_effects_are_live(
        versions: Versions) -> None:
    w = World(versions, story(versions), request={"requested": True, "reason": "r", "entries": ["c-1"]})
    first = w.step()
    assert first.status["live"] == 4  # before: the charge, the comment, the issue and the draft
    (step,) = w.steps()
    w.finish(step["job"], undone(w.step_input(w.created[-1])))
    d = w.step()
    rolled = w.condition("RolledBack")
    assert (rolled["status"], rolled["reason"]) == ("False", "PartiallyRolledBack")
    assert "3 other entries of the run still have live effects (pay-1, i-1, rel-1)" in rolled["message"]
    assert "kubectl unwind rollback ledger/run-42 -n shop --reason TEXT undoes them" in rolled["message"]
    assert "kubectl unwind settle ledger/run-42 ENTRY -n shop --reason TEXT" in rolled["message"]
    assert w.condition("Degraded")["status"] == "False"
    assert w.view.live == 3 and d.status["live"] == 3
    assert [e.reason for e in d.events] == ["StepSucceeded", "PartiallyRolledBack"]
    # the rest rolled back by a second request: now RolledBack, nothing live
    w.view.request = {"requested": True, "reason": "the rest", "requestedAt": "later"}
    w.view.generation += 1
    w.step(parallelism=4)
    for s in [s for s in w.steps() if s["state"] == "running"]:
        body = next(b for b in w.created if b["metadata"]["name"] == s["job"])
        w.finish(s["job"], undone(w.step_input(body)))
    w.step()
    assert w.condition("RolledBack")["status"] == "True" and w.view.live == 0


def test_a_full_rollback_that_leaves_an_irreversible_effect_behind_reads_rolled_back_and_counts_it_live(
        versions: Versions) -> None:
    sent = entry(versions, "m-1", "test.issue_without_number", {"repo": "octo/hello", "title": "t"}, {}, 1)
    w = World(versions, [sent])
    w.step()
    assert [s["state"] for s in w.steps()] == ["left"]
    assert w.condition("RolledBack")["status"] == "True"
    assert "left behind: m-1 (unrecoverable)" in w.condition("RolledBack")["message"]
    assert w.view.live == 1


def test_independent_steps_run_at_once_up_to_the_parallelism(versions: Versions) -> None:
    w = World(versions, story(versions))
    d = w.step(parallelism=3)
    assert len(d.jobs) == 3


def test_a_failed_read_back_fails_the_step_with_the_first_mismatch_and_degrades_the_ledger(versions: Versions) -> None:
    w = World(versions, story(versions))
    w.step()
    first = w.steps()[0]
    w.finish(first["job"], {"ok": False, "outcome": "undo_failed", "entry_state": "undo_failed",
                            "reason": "read-back did not match", "first_mismatch": "found is true, expected false"})
    d = w.step()
    assert not d.jobs
    assert w.steps()[0]["state"] == "failed"
    assert w.steps()[0]["first_mismatch"] == "found is true, expected false"
    assert [s["state"] for s in w.steps()[1:]] == ["cancelled"] * 3
    assert w.steps()[1]["message"] == "not run: step 1 (rel-1 discard github.delete_release) failed"
    assert w.entry("rel-1").state == "undo_failed"
    degraded = w.condition("Degraded")
    assert degraded["status"] == "True" and "step 1 (rel-1 discard github.delete_release)" in degraded["message"]
    assert w.condition("RolledBack")["reason"] == "StepFailed"


def test_a_restarted_operator_recreates_a_job_written_ahead_and_never_a_second_one(versions: Versions) -> None:
    w = World(versions, story(versions)[:1])
    first = w.step().jobs[0]
    w.jobs.clear()  # the operator stopped after writing the status, before creating the Job
    again = w.step().jobs
    assert [j["metadata"]["name"] for j in again] == [first["metadata"]["name"]]
    w.jobs[first["metadata"]["name"]] = JobView(first["metadata"]["name"], "running")
    assert not w.step().jobs
    assert w.entry("pay-1").undo["tries"] == 1


def test_a_step_whose_compensation_requires_approval_waits_for_an_approval_made_after_the_plan(versions: Versions) -> None:
    e = entry(versions, "i-9", "test.issue_closed_with_approval", {"repo": "octo/hello"}, {"number": 5}, 1)
    w = World(versions, [e])
    w.decisions["i-9"] = [ApprovalDecision(name="old", user="bob", decision="approve",
                                           created=stamp(NOW - timedelta(hours=1)))]
    d = w.step()
    assert not d.jobs and w.steps()[0]["state"] == "waiting"
    assert w.condition("RolledBack")["reason"] == "WaitingForApproval"
    assert "kubectl unwind approve ledger/run-42 --entry i-9 -n shop" in w.condition("RolledBack")["message"]
    waiting = [e for e in d.events if e.reason == "WaitingForApproval"]
    assert waiting and waiting[0].message.endswith("kubectl unwind approve ledger/run-42 --entry i-9 -n shop")
    w.decisions["i-9"].append(ApprovalDecision(name="now", user="carol", groups=["finance"],
                                               decision="approve", created=stamp(w.now)))
    d = w.step()
    assert len(d.jobs) == 1
    assert w.steps()[0]["approved_by"]["user"] == "carol"
    assert w.entry("i-9").undo["approved_by"]["approval"] == "now"


def test_a_denied_step_is_not_run_and_degrades_the_ledger(versions: Versions) -> None:
    e = entry(versions, "i-9", "test.issue_closed_with_approval", {"repo": "octo/hello"}, {"number": 5}, 1)
    w = World(versions, [e])
    w.decisions["i-9"] = [ApprovalDecision(name="no", user="carol", decision="deny", created=stamp(NOW))]
    d = w.step()
    assert not d.jobs and w.steps()[0]["state"] == "denied"
    assert w.condition("Degraded")["status"] == "True"


def test_an_unrecoverable_entry_is_left_behind_and_the_rest_is_rolled_back(versions: Versions) -> None:
    bad = entry(versions, "x-1", "test.issue_without_number", {"repo": "octo/hello"}, {"number": 1}, 1)
    w = World(versions, [bad, *story(versions)[2:3]])
    w.step()
    left = next(s for s in w.steps() if s["entry"] == "x-1")
    assert left["state"] == "left" and left["action"] == "unrecoverable"
    job = next(s for s in w.steps() if s["state"] == "running")["job"]
    w.finish(job, undone(w.step_input(w.created[-1])))
    w.step()
    rolled = w.condition("RolledBack")
    assert rolled["status"] == "True" and "x-1 (unrecoverable)" in rolled["message"]


def test_since_plans_only_what_came_after_the_checkpoint(versions: Versions) -> None:
    w = World(versions, story(versions), request={"requested": True, "since": "c-1"})
    w.step()
    assert [s["entry"] for s in w.steps()] == ["rel-1", "i-1"]


def test_an_unknown_entry_fails_the_plan_with_its_reason(versions: Versions) -> None:
    w = World(versions, story(versions), request={"requested": True, "entries": ["nope"]})
    d = w.step()
    assert not d.jobs
    planned = w.condition("RollbackPlanned")
    assert planned["status"] == "False" and planned["reason"] == "PlanFailed" and "nope" in planned["message"]


def test_a_lost_answer_is_looked_up_first_and_when_found_undone_like_any_other(versions: Versions) -> None:
    lost = entry(versions, "pay-2", "stripe.create_charge", {"order_id": "o2", "amount": 900}, {}, 1,
                 state="uncertain", key="charge-o2")
    w = World(versions, [lost, *story(versions)[1:2]])
    w.step(parallelism=4)
    assert [(s["entry"], s["action"], s["state"]) for s in w.steps()] == [
        ("pay-2", "lookup", "running"), ("c-1", "inverse", "pending")]  # undos wait for lookups
    handle = Handle(args={"order_id": "o2", "amount": 900}, result={"id": "ch_7"}).model_dump()
    w.finish(w.steps()[0]["job"], {"ok": True, "outcome": "found", "entry_state": "succeeded",
                                   "handle": handle, "reason": "found"})
    w.step(parallelism=4)
    assert w.entry("pay-2").state in ("succeeded", "undoing")
    assert [(s["entry"], s["action"]) for s in w.steps()] == [
        ("pay-2", "lookup"), ("c-1", "inverse"), ("pay-2", "compensate")]
    assert w.view.rollback["replanned"]
    refund = next(w.step_input(j) for j in w.created if w.step_input(j)["step"]["entry"] == "pay-2"
                  and w.step_input(j)["step"]["action"] == "compensate")
    assert refund["step"]["arguments"] == {"charge_id": "ch_7", "amount": 900}


def test_an_uncertain_entry_is_looked_up_on_the_timer_and_marked_failed_when_not_found(versions: Versions) -> None:
    lost = entry(versions, "pay-3", "stripe.create_charge", {"order_id": "o3", "amount": 1}, {}, 1,
                 state="uncertain", key="charge-o3")
    w = World(versions, [lost], request={})
    d = w.step()
    (job,) = d.jobs
    assert job["metadata"]["name"] == lookup_job_name("run-42", UID, "pay-3", 1)
    assert w.step_input(job)["step"]["action"] == "lookup"
    w.finish(job["metadata"]["name"], {"ok": True, "outcome": "not_found", "entry_state": "failed",
                                       "reason": "404"})
    d = w.step()
    assert w.entry("pay-3").state == "failed" and w.entry("pay-3").error.code == "not_found"
    assert d.delete_jobs == [job["metadata"]["name"]]
    assert [e.reason for e in d.events] == ["LostAnswerNotFound"]


def test_a_failed_timer_lookup_is_tried_again_later_with_a_new_job(versions: Versions) -> None:
    lost = entry(versions, "pay-4", "stripe.create_charge", {"order_id": "o4", "amount": 1}, {}, 1,
                 state="uncertain", key="charge-o4")
    w = World(versions, [lost], request={})
    job = w.step().jobs[0]["metadata"]["name"]
    w.finish(job, {"ok": False, "outcome": "lookup_failed", "entry_state": "uncertain",
                   "reason": "500", "finished": stamp(w.now)})
    w.step()
    assert w.entry("pay-4").undo["lookup"]["outcome"] == "lookup_failed"
    assert not w.step().jobs  # not before the interval
    w.now += timedelta(seconds=61)
    (again,) = w.step().jobs
    assert again["metadata"]["name"] == lookup_job_name("run-42", UID, "pay-4", 2)


def test_a_new_request_plans_again_and_retries_a_failed_undo_with_new_job_names(versions: Versions) -> None:
    w = World(versions, story(versions)[:1])
    w.step()
    w.finish(w.steps()[0]["job"], {"ok": False, "outcome": "undo_failed", "entry_state": "undo_failed",
                                   "reason": "500"})
    w.step()
    w.view.generation = 3
    w.view.request = {"requested": True, "reason": "again"}
    d = w.step()
    (job,) = d.jobs
    assert job["metadata"]["name"] == job_name("run-42", UID, 1, "pay-1", "compensate", 3)
    assert "retries a failed undo" in w.steps()[0]["reason"]
    assert w.condition("Degraded")["status"] == "False"


def test_withdrawing_the_request_cancels_the_steps_not_started(versions: Versions) -> None:
    w = World(versions, story(versions))
    w.step()
    w.view.generation = 3
    w.view.request = {"requested": False}
    w.step()
    assert [s["state"] for s in w.steps()] == ["running", "cancelled", "cancelled", "cancelled"]
    w.finish(w.steps()[0]["job"], undone({"step": {"entry": "rel-1"}}))
    w.step()
    assert w.condition("RolledBack")["reason"] == "Cancelled"
    assert w.view.rollback["finished"]


def test_job_names_are_dns_labels_and_entry_labels_are_valid_label_values() -> None:
    name = job_name("r" * 63, UID, 12345, "e", "compensate", 7)
    assert len(name) <= 63 and name.startswith("r" * 40 + "-undo-12345-")
    assert len(lookup_job_name("r" * 63, UID, "e", 1)) <= 63
    assert label_value("e-0007") == "e-0007"
    assert label_value("a:b").startswith("x-") and len(label_value("y" * 100)) <= 63


def test_a_ledger_named_longer_than_a_label_value_labels_its_jobs_with_a_hash_and_is_found_by_owner() -> None:
    long = "run-" + "x" * 249  # 253 characters: a valid EffectLedger name
    job = job_body(name=job_name(long, UID, 1, "e", "inverse", 2), ledger=long, uid=UID, entry="e", step="1",
                   text="{}", image="unwind:test", deadline=60, manifests=[])
    value = job["metadata"]["labels"]["unwind.dev/ledger"]
    assert len(value) <= 63 and value == label_value(long)
    assert job["spec"]["template"]["metadata"]["labels"]["unwind.dev/ledger"] == value
    assert ledger_of_job(job["metadata"]) == long
    assert ledger_of_job({"labels": {"unwind.dev/ledger": "run-1"}}) == "run-1"


def test_a_step_input_too_large_for_a_job_fails_the_step_with_why(versions: Versions) -> None:
    big = entry(versions, "i-2", "github.create_issue", {"repo": "o/" + "x" * MAX_STEP_BYTES}, {"number": 3}, 1)
    w = World(versions, [big])
    d = w.step()
    assert not d.jobs
    assert w.steps()[0]["state"] == "failed" and "KiB" in w.steps()[0]["message"]


def test_a_call_its_restarted_gateway_never_finished_is_not_looked_up_on_the_timer(
        versions: Versions) -> None:
    # the gateway wrote pay-5 ahead, then was killed during the call: it stays pending. The
    # timer leaves it alone: found by its key alone, another entry's charge under that key
    # would be undone twice (the simulation's seed 569); a rollback's plan first asks the lock
    orphan = entry(versions, "pay-5", "stripe.create_charge", {"order_id": "o5", "amount": 1}, {}, 1,
                   state="pending", key="charge-o5").model_copy(
        update={"deadline": stamp(NOW + timedelta(seconds=30))})
    w = World(versions, [orphan], request={})
    assert not w.step().jobs
    w.now += timedelta(hours=2)
    assert not w.step().jobs  # past its deadline too: no lookup outside a rollback
    assert w.entry("pay-5").state == "pending"


def test_a_step_whose_pod_cannot_start_names_step_pod_and_cause_and_clears_once_it_runs(versions: Versions) -> None:
    w = World(versions, story(versions))
    name = w.step().jobs[0]["metadata"]["name"]
    cause = "pod p-1: a volume cannot be mounted (FailedMount: ...): Secret 'tickets-api' not found; recreate it"
    w.jobs[name] = JobView(name, "running", stuck=cause)
    d = w.step()
    rolled = w.condition("RolledBack")
    assert rolled["reason"] == "StepStuck" and rolled["status"] == "False"
    assert "step 1 (rel-1" in rolled["message"] and name in rolled["message"] and "tickets-api" in rolled["message"]
    assert [e.reason for e in d.events] == ["StepStuck"]
    assert [e.reason for e in w.step().events] == []  # said once, not on every pass
    w.jobs[name] = JobView(name, "running")  # the Secret was recreated: the pod starts
    w.step()
    assert w.condition("RolledBack")["reason"] == "InProgress"
