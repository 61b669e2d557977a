"""A run's rollback in the cluster, as a pure function: ledger, Jobs and clock in; what to
write out (the ledger's status, entry changes, Jobs to create, Events).

The operator is level-triggered. Everything it needs to go on is in the API server: the
frozen plan and each step's state in the first page's ``status.rollback``, each entry's
state (``undoing`` is written before its Job is created), and the Jobs themselves, named
deterministically (``undojob.job_name``). Killed at any moment and restarted, the next
pass reads those and continues: a step whose Job exists is never started again (a create
answers 409), a step whose Job finished is recorded from the Job's termination message,
and a retried undo carries the step's idempotency key, so the upstream deduplicates it.

The order (docs/rollback.md, "In the cluster"):

1. ``spec.rollback.requested`` with a generation the status has not frozen yet: the run is
   fenced (``status.fence`` on every page, so no gateway writes a call ahead any more),
   its entries still awaiting approval are denied, and while calls written ahead are in
   flight (pending, before their deadline) the pass only says so (``WaitingForCalls``) and
   looks again. Then the plan is made (``unwind.ledger.plan``, as of now, with the holders
   of the pending entries' key Leases) and frozen, skip steps counted, the others listed.
   Steps of an earlier request still running are recorded first. A withdrawn request
   lifts the fence. What the entries go through is ``ledger/rollback_rules.py``, shared
   with the local rollback.
2. Lookups first. When one found its effect, the undo steps are planned again once every
   lookup is done, so found entries take their place.
3. Then the undo steps in plan order, at most ``parallelism`` at once. A step starts when
   every earlier unfinished step is *independent* of it: a different entry, and neither
   entry's tool ``requires`` the other's tool (in the manifest versions they ran under).
   That is the only order the planner has a reason for; the rest of "newest first" does
   not say that one undo needs another done first.
4. A step whose compensation ``requires_approval`` waits for a stamped Approval of its
   entry made after the plan was frozen; a deny ends it ``denied``.
5. A failed step stops the rollback: nothing new starts, the running steps are recorded,
   and the ledger is ``Degraded`` naming the failed steps. Asking again (a new request)
   plans again from the entries: undone ones are skipped, failed ones retried.
6. When every step succeeded, the ledger reads ``RolledBack`` only if no effect of the run
   is still live beyond what the plan reported as left behind; a rollback of some entries
   (``--entry``, ``--since``) whose run has other live effects reads ``RolledBack=False``,
   reason ``PartiallyRolledBack``. ``status.live`` (the LIVE column) counts the live entries.

Outside a rollback, ``uncertain`` entries (the answer was lost) are looked up on a timer
through their manifest's lookup, each attempt a Job, and become ``succeeded`` (found, with
the handle completed from the answer) or ``failed`` (404: it never happened).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from ..api.conditions import get_condition, set_condition
from ..api.resources import LedgerRollback, RollbackStatus
from ..ledger import rollback_rules as rules
from ..ledger.entry import ApprovalDecision, Entry, parse_stamp, stamp
from ..ledger.fence import Fence
from ..ledger.lifecycle import AnyWrite, deadline_passed
from ..ledger.objects import moot_reason
from ..ledger.plan import (
    UNDOING,
    PlanError,
    Selection,
    Step,
    Versions,
    make_plan,
    never_ran,
    plan_entry,
)
from ..ledger.stepinput import ledger_identity, step_input, step_key
from ..ledger.store import Holder, Stale
from . import rollback_audit as audit
from .objects import Event
from .undojob import deadline_seconds, job_body, job_name, lookup_job_name, step_problem, step_text

OK_STATES = frozenset({"succeeded", "left", "skipped", "moot", "settled"})  # a later step may go on
FAILED_STATES = frozenset({"failed", "denied"})
TERMINAL = OK_STATES | FAILED_STATES | {"cancelled"}
MAX_FROZEN_BYTES = 400 * 1024  # the frozen plan shares the first page with its entries
BY = "unwind-operator"
KIND = "EffectLedger"
MAX_LOOKUP_WAIT = 3600.0

PLANNED, ROLLED_BACK, DEGRADED = "RollbackPlanned", "RolledBack", "Degraded"


class Reason:
    """Condition reasons (docs/rollback.md lists them)."""

    PLANNED = "Planned"
    WAITING_FOR_CALLS = "WaitingForCalls"  # fenced: calls written ahead are still in flight
    PLAN_FAILED = "PlanFailed"
    PLAN_TOO_LARGE = "PlanTooLarge"
    NO_IMAGE = "NoImage"
    SUPERSEDING = "Superseding"
    IN_PROGRESS = "InProgress"
    WAITING_FOR_APPROVAL = "WaitingForApproval"
    ROLLED_BACK = "RolledBack"
    STEP_FAILED = "StepFailed"
    STEP_STUCK = "StepStuck"  # a running step's pod cannot start (a missing Secret, an image, ...)
    CANCELLED = "Cancelled"
    NO_FAILURES = "NoFailures"
    PARTIALLY_ROLLED_BACK = "PartiallyRolledBack"  # every step ran; other effects still live
    # The operator could not do its part for this ledger (operator/ledgerfailures.py); the
    # other ledgers of the namespace go on. Degraded=True, and RolledBack=False while a
    # rollback is asked for.
    STATUS_WRITE_FAILED = "StatusWriteFailed"  # the API server refused the ledger's status
    RECONCILE_FAILED = "ReconcileFailed"  # deciding the ledger raised (an operator bug)
    DECISIONS_WRITE_FAILED = "DecisionsWriteFailed"  # Approvals' decisions not written in


# Reasons of a failure of the operator's pass, not of a step: a pass that writes clears them.
PASS_FAILURES = frozenset({Reason.STATUS_WRITE_FAILED, Reason.RECONCILE_FAILED})
def live_entries(entries: Sequence[Entry]) -> list[Entry]:
    """The entries whose effects may still stand in the world (``rollback_rules.is_live``):
    `kubectl unwind plan` lists a step for each."""
    return [e for e in entries if rules.is_live(e.state, e.effect)]


Change = AnyWrite  # every entry change is a lifecycle write (ledger/rollback_rules.py)


@dataclass(frozen=True)
class JobView:
    """A Job as the operator sees it: how it ended, and its pod's termination message."""

    name: str
    phase: str  # running | succeeded | failed
    message: str | None = None  # the step runner's JSON line, when a pod wrote one
    why: str = ""  # a failed Job's condition (DeadlineExceeded, BackoffLimitExceeded)
    stuck: str = ""  # why its pod cannot start or keeps dying (operator/undo_pods.py)


@dataclass
class LedgerView:
    """A run's first page and the entries of all its pages."""

    name: str
    uid: str
    run: str
    generation: int
    request: dict[str, Any] | None
    rollback: dict[str, Any] | None
    conditions: list[dict[str, Any]]
    entries: list[Entry]
    requester: dict[str, Any] | None = None  # RollbackStatus.requestedBy, the stamp checked
    live: int | None = None  # status.live as read
    pages: int = 1  # the run's pages
    fenced_pages: int = 0  # how many of them carry the rollback's fence (status.fence)
    # Who holds the key of each keyed pending entry (by id), read from the Leases; None:
    # not read (the planner then asks the ledger alone).
    holders: Mapping[str, Holder | None] | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # status.rollbacks as read
    dropped: int = 0  # status.rollbacksDropped as read


@dataclass(frozen=True)
class Context:
    namespace: str
    now: datetime
    image: str
    parallelism: int = 4
    lookup_every: float = 60.0  # seconds between lookups of a lost answer (doubling)
    trace_env: tuple[tuple[str, str], ...] = ()  # OTLP settings for the Jobs (undojob.trace_env)


@dataclass
class Decision:
    status: dict[str, Any] = field(default_factory=dict)  # first page status fields to set
    changes: dict[str, Change] = field(default_factory=dict)  # entry id -> change
    jobs: list[dict[str, Any]] = field(default_factory=list)  # Job bodies to create
    delete_jobs: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    fence: dict[str, Any] | None = None  # write into every page that has none (status.fence)
    lift_fence: bool = False  # the request was withdrawn: remove the fence from every page
    waiting: bool = False  # for calls in flight: look again soon

    @property
    def empty(self) -> bool:
        return not (self.status or self.changes or self.jobs or self.delete_jobs or self.events
                    or self.fence or self.lift_fence)


def decide(ledger: LedgerView, versions: Callable[[], Versions], jobs: Mapping[str, JobView],
           decisions: Mapping[str, Sequence[ApprovalDecision]], ctx: Context,
           refused: Mapping[str, str] | None = None) -> Decision:
    """What to write for one ledger. ``versions`` is called only when a plan or a step input
    must be made; ``decisions`` are the stamped Approvals of its entries; ``refused`` are
    Jobs the API server would not create (by name: why)."""
    p = _Pass(ledger, versions, jobs, decisions, ctx, refused or {})
    p.rollback()
    p.lookups()
    p.recovered()
    return p.result()


def clean(value: Any) -> Any:
    """Without None and empty strings: the local 1.20 API server refuses "" inside the
    items of a custom resource's lists (as Entry.to_json does)."""
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items() if v is not None and v != ""}
    if isinstance(value, list):
        return [clean(v) for v in value]
    return value


def parse_result(message: str | None) -> dict[str, Any] | None:
    """The step runner's result from a termination message (its last JSON line)."""
    for line in reversed((message or "").strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict) and "ok" in value:
            return value
    return None


class _Pass:
    def __init__(self, ledger: LedgerView, versions: Callable[[], Versions],
                 jobs: Mapping[str, JobView], decisions: Mapping[str, Sequence[ApprovalDecision]],
                 ctx: Context, refused: Mapping[str, str]) -> None:
        self.ledger, self.jobs, self.decisions, self.ctx, self.refused = ledger, jobs, decisions, ctx, refused
        self._versions_fn = versions
        self._versions: Versions | None = None
        self.out = Decision()
        self.entries = {e.id: e for e in ledger.entries}
        # Step keys come from the ledger object (namespace and uid), never from its name alone.
        self._identity = ledger_identity(ctx.namespace, ledger.uid, ledger.entries)
        self.now = stamp(ctx.now)
        self.rb: dict[str, Any] | None = None
        self.waiting: list[Entry] = []  # calls in flight a new request waits for
        self._history: list[dict[str, Any]] | None = None  # status.rollbacks, when changed
        self._dropped: int | None = None
        self.original = ledger.rollback
        if ledger.rollback is not None:
            try:
                self.rb = RollbackStatus.model_validate(ledger.rollback).model_dump(mode="json")
            except ValidationError as exc:
                self._event("Warning", "RollbackStatusInvalid", f"status.rollback cannot be read "
                            f"({exc.errors()[0]['msg']}): the request is planned again")
        try:
            self.request = LedgerRollback.model_validate(ledger.request or {})
        except ValidationError as exc:
            self.request = LedgerRollback()
            self._event("Warning", "RollbackRequestInvalid", f"spec.rollback cannot be read: "
                        f"{exc.errors()[0]['msg']}")

    # ---- helpers ------------------------------------------------------------------
    def versions(self) -> Versions:
        if self._versions is None:
            self._versions = self._versions_fn()
        return self._versions

    @property
    def _ns(self) -> str:
        """`` -n NAMESPACE`` for the commands a message suggests: they must work as written."""
        return f" -n {self.ctx.namespace}" if self.ctx.namespace else ""

    def _event(self, type_: str, reason: str, message: str) -> None:
        self.out.events.append(Event(self.ledger.name, type_, reason, message, kind=KIND))

    def _change(self, entry_id: str, change: Change) -> None:
        """Queue a change of an entry, and apply it to this pass's view of the entries."""
        before = self.out.changes.get(entry_id)
        self.out.changes[entry_id] = change if before is None else _then(before, change)
        entry = self.entries.get(entry_id)
        if entry is not None:
            with contextlib.suppress(Stale):
                self.entries[entry_id] = change(entry)

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.rb["steps"] if self.rb is not None else []

    def _label(self, s: dict[str, Any]) -> str:
        tool = f" {s['undo_tool']}" if s.get("undo_tool") else ""
        return f"step {s['index']} ({s['entry']} {s['action']}{tool})"

    # ---- the rollback -------------------------------------------------------------
    def rollback(self) -> None:
        gen, rb, req = self.ledger.generation, self.rb, self.request
        if rb is not None and not rb.get("finished"):
            for s in self.steps:
                if s["state"] == "running":
                    self._record(s)
        current = rb is not None and rb["generation"] == gen
        self._settled_steps()
        if rb is not None and not rb.get("finished") and not (current and req.requested):
            for s in self.steps:  # a cancelled or superseded request starts nothing more
                if s["state"] in ("pending", "waiting"):
                    s.update(state="cancelled", message="the request was withdrawn or replaced")
            self._finish_if_done()
        if req.requested and not current:
            running = [s for s in self.steps if s["state"] == "running"]
            if not running and self._closed():
                self._freeze()
        elif req.requested and current and rb is not None and not rb.get("finished") \
                and not rb.get("error"):
            self._replan_if_found()
            self._advance()
            self._finish_if_done()
        if not req.requested and self.ledger.fenced_pages:
            self.out.lift_fence = True  # withdrawn: the run takes calls again
        self._conditions()

    def _closed(self) -> bool:
        """Fence the run (every page, in this pass's conditional writes), deny what still
        awaits approval, and say whether the calls written ahead are all over: only then
        is the plan made (ledger/rollback_rules.py)."""
        by = (self.ledger.requester or {}).get("user")
        fence = Fence(since=self.now, by=by if isinstance(by, str) else None,
                      reason=self.request.reason, generation=self.ledger.generation)
        if self.ledger.fenced_pages < self.ledger.pages:
            self.out.fence = fence.to_json()
        for entry in rules.awaiting(list(self.entries.values())):
            self._change(entry.id, rules.deny_for_rollback(entry, fence, self.ledger.name))
        self.waiting = rules.in_flight(list(self.entries.values()), self.ctx.now)
        if not self.waiting:
            return True
        self.out.waiting = True
        self._remember(audit.seen_record(self.ledger.generation, clean(self.request.model_dump(
            mode="json")), self.ledger.requester, self.now))
        return False

    def _waiting_message(self) -> str:
        until = rules.last_deadline(self.waiting)
        ids = ", ".join(e.id for e in self.waiting[:5]) + (", ..." if len(self.waiting) > 5 else "")
        return (f"the run is closed to new calls; waiting for {_n(len(self.waiting), 'call')} in "
                f"flight to finish or pass its deadline ({ids}; until "
                f"{stamp(until) if until else 'their deadlines'} at the latest), then the plan is made")

    def _freeze(self) -> None:
        req, v = self.request, None
        rb: dict[str, Any] = {"request": clean(req.model_dump(mode="json")),
                              **({"requestedBy": self.ledger.requester} if self.ledger.requester else {}),
                              "generation": self.ledger.generation, "planned": self.now,
                              "skipped": 0, "steps": []}
        self.rb = rb
        if not self.ctx.image:
            rb.update(error="the operator has no image for undo Jobs: start it with "
                      "--gateway-image (the image that runs `unwind undo-step`)",
                      reason=Reason.NO_IMAGE, finished=self.now)
            self._event("Warning", Reason.NO_IMAGE, rb["error"])
            return
        try:
            v = self.versions()
            plan = make_plan(self.ledger.name, list(self.entries.values()), v, now=self.ctx.now,
                             selection=Selection(tuple(req.entries), req.since),
                             holders=self.ledger.holders)
        except PlanError as exc:
            rb.update(error=str(exc), reason=Reason.PLAN_FAILED, finished=self.now)
            self._event("Warning", Reason.PLAN_FAILED, f"no rollback plan: {exc}")
            return
        rb["steps"], rb["skipped"] = self._frozen(plan.steps, 1)
        self._never_sent(plan.steps)
        size = len(json.dumps(rb["steps"]).encode())
        if size > MAX_FROZEN_BYTES:
            rb.update(steps=[], error=f"the plan has {len(plan.steps)} steps ({size // 1024} KiB), "
                      "more than a ledger's status holds: roll back in parts with --since or "
                      "--entry", reason=Reason.PLAN_TOO_LARGE, finished=self.now)
            self._event("Warning", Reason.PLAN_TOO_LARGE, rb["error"])
            return
        who = (self.ledger.requester or {}).get("user")
        self._event("Normal", Reason.PLANNED, f"rollback planned: {self._summary()}"
                    + (f"; requested by {who}" if who else "")
                    + (f"; reason: {req.reason}" if req.reason else ""))
        self._replan_if_found()
        self._advance()
        self._finish_if_done()

    def _never_sent(self, steps: Sequence[Step]) -> None:
        """The pending entries skipped because they never ran are recorded refused, as
        their gateway would have (ledger/rollback_rules.py: never_sent)."""
        entries = list(self.entries.values())
        for s in steps:
            entry = self.entries.get(s.entry)
            if s.action != "skip" or entry is None or entry.state != "pending":
                continue
            why = never_ran(self.ledger.name, entry, entries, self.ledger.holders)
            if why is not None and deadline_passed(entry, self.ctx.now):
                self._change(entry.id, rules.never_sent(entry, why, self.ctx.now))

    def _frozen(self, steps: Sequence[Step], first: int) -> tuple[list[dict[str, Any]], int]:
        out: list[dict[str, Any]] = []
        skipped = 0
        for s in steps:
            if s.action == "skip" and not s.residue:  # an idempotent call's change is left
                skipped += 1
                continue
            runs = s.action in UNDOING or s.action in ("lookup", "moot")
            frozen = {**s.to_json(), "index": first + len(out), "attempts": 0,
                      "state": "pending" if runs else "left"}
            if s.action in UNDOING:
                frozen["idempotency_key"] = step_key(self._identity, s.entry, s.action)
            out.append(clean(frozen))
        return out, skipped

    def _summary(self) -> str:
        steps = self.steps
        count = {a: sum(1 for s in steps if s["action"] == a) for a in ("lookup",)}
        undo = sum(1 for s in steps if s["action"] in UNDOING)
        left = [s for s in steps if s["state"] == "left"]
        assert self.rb is not None
        return (f"{_n(count['lookup'] + undo, 'step')} to run ({_n(count['lookup'], 'lookup')}, "
                f"{_n(undo, 'undo')}), {len(left)} left behind, {self.rb['skipped']} with nothing to undo")

    def _replan_if_found(self) -> None:
        """Once every lookup is done and one found its effect, plan the undos again."""
        rb = self.rb
        assert rb is not None
        lookups = [s for s in self.steps if s["action"] == "lookup"]
        if rb.get("replanned") or not any(s.get("outcome") == "found" for s in lookups):
            return
        if any(s["state"] not in TERMINAL for s in lookups) or \
                any(s["state"] in FAILED_STATES for s in self.steps):
            return
        req = self.request
        try:
            plan = make_plan(self.ledger.name, list(self.entries.values()), self.versions(),
                             now=self.ctx.now, selection=Selection(tuple(req.entries), req.since),
                             holders=self.ledger.holders)
        except PlanError as exc:
            rb["replanned"] = self.now
            for s in self.steps:
                if s["state"] == "pending":
                    s.update(state="failed", message=f"could not be planned again: {exc}")
            return
        fresh = [s for s in plan.steps if s.action != "lookup"]
        undo, skipped = self._frozen(fresh, len(lookups) + 1)
        rb.update(steps=lookups + undo, skipped=skipped, replanned=self.now)
        self._event("Normal", "Replanned", f"lookups found {sum(1 for s in lookups if s.get('outcome') == 'found')} "
                    f"lost answers: the undos were planned again: {self._summary()}")

    def _independent(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        """Two steps may run at once: different entries, on different objects (the plan's
        object keys: undos of one object run in plan order, one at a time), and neither
        entry's tool requires the other's."""
        if a["entry"] == b["entry"]:
            return False
        if a["action"] == "lookup" and b["action"] == "lookup":
            return True
        if a.get("object") is not None and a.get("object") == b.get("object"):
            return False
        return b["tool"] not in self._requires(a) and a["tool"] not in self._requires(b)

    def _requires(self, s: dict[str, Any]) -> set[str]:
        entry = self.entries.get(s["entry"])
        m = self.versions().of(entry)[0] if entry is not None else None
        return {r.tool for r in m.requires} if m is not None else set()

    def _advance(self) -> None:
        failed = next((s for s in self.steps if s["state"] in FAILED_STATES), None)
        if failed is not None:  # a failed step stops the rollback; what runs is recorded
            for s in self.steps:
                if s["state"] in ("pending", "waiting"):
                    s.update(state="cancelled", message=f"not run: {self._label(failed)} failed")
            return
        running = sum(1 for s in self.steps if s["state"] == "running")
        lookups_open = any(s["action"] == "lookup" and s["state"] not in TERMINAL for s in self.steps)
        unfinished: list[dict[str, Any]] = [s for s in self.steps if s["state"] == "running"]
        for s in self.steps:
            if s["state"] not in ("pending", "waiting"):
                continue
            if s["action"] != "lookup" and lookups_open:
                break
            if running >= self.ctx.parallelism:
                break
            if not all(self._independent(s, u) for u in unfinished if u is not s):
                unfinished.append(s)
                continue
            self._start(s)
            if s["state"] in FAILED_STATES:
                self._advance()
                return
            if s["state"] == "running":
                running += 1
            if s["state"] not in TERMINAL:
                unfinished.append(s)

    def _approval(self, s: dict[str, Any]) -> ApprovalDecision | None:
        """The first stamped decision on the entry made after the plan was frozen (to the
        second: Kubernetes stamps objects so)."""
        assert self.rb is not None
        since = self.rb["planned"][:19]
        for d in self.decisions.get(s["entry"], ()):
            if d.created[:19] >= since:
                return d
        return None

    def _start(self, s: dict[str, Any]) -> None:
        entry = self.entries.get(s["entry"])
        if entry is None:
            s.update(state="skipped", message="the entry is no longer in the ledger")
            return
        lookup = s["action"] == "lookup"
        if lookup and entry.state not in rules.LOOKUP_STATES:
            s.update(state="succeeded", outcome="resolved", message=f"resolved meanwhile: the entry is {entry.state}")
            return
        if lookup and not rules.may_look_up(entry, self.ctx.now):
            return  # its call may still be in flight: never looked up before its deadline
        if not lookup and entry.state == "undone":
            s.update(state="succeeded", outcome="undone", message="already undone")
            return
        if not lookup and not rules.may_undo(entry):
            s.update(state="skipped", message=f"the entry is {entry.state} now: nothing to undo")
            return
        if not lookup and self._moot(s, entry):
            return
        approved: dict[str, Any] | None = None
        if s.get("requires_approval"):
            d = self._approval(s)
            if d is None:
                if s["state"] != "waiting":
                    s["state"] = "waiting"
                    self._event("Normal", Reason.WAITING_FOR_APPROVAL, f"{self._label(s)} needs an "
                                f"Approval: kubectl unwind approve ledger/{self.ledger.name} --entry {s['entry']}{self._ns}")
                return
            if d.decision == "deny":
                s.update(state="denied", message=f"denied by {d.user} (Approval {d.name})"
                         + (f": {d.reason}" if d.reason else ""), finished=self.now)
                self._event("Warning", "StepDenied", f"{self._label(s)}: {s['message']}")
                return
            approved = {"user": d.user, "groups": list(d.groups), "approval": d.name,
                        "identities": "kubernetes"}
            s["approved_by"] = approved
        self._launch(s, entry, approved)

    def _step_of(self, s: dict[str, Any], entry: Entry) -> Step | str:
        """The plan step again, with what the JSON does not hold (the read-back, the
        timeout), as of the moment it was planned; or why it cannot be had."""
        assert self.rb is not None
        moment = parse_stamp(self.rb.get("replanned") or self.rb["planned"])
        fresh = plan_entry(entry, self.versions(), moment)
        if fresh.action != s["action"] or fresh.undo_tool != s.get("undo_tool"):
            return (f"the entry's undo is not what was planned any more (now {fresh.action}: "
                    f"{fresh.reason}): ask for the rollback again")
        return dataclasses.replace(fresh, arguments=s.get("arguments"))

    def _launch(self, s: dict[str, Any], entry: Entry, approved: dict[str, Any] | None) -> None:
        assert self.rb is not None
        step = self._step_of(s, entry)
        name = job_name(self.ledger.name, self.ledger.uid, s["index"], s["entry"], s["action"],
                        self.rb["generation"])
        body = self._body(step, entry, name, str(s["index"])) if isinstance(step, Step) else step
        if isinstance(body, str):
            s.update(state="failed", message=body, finished=self.now)
            self._event("Warning", "StepFailed", f"{self._label(s)} cannot run: {body}")
            return
        s.update(state="running", job=name, attempts=int(s.get("attempts", 0)) + 1, started=self.now)
        self.out.jobs.append(body)
        if s["action"] == "lookup":
            self._change(entry.id, rules.lookup_begin(entry, name, s.get("undo_tool"), self.now,
                                                      self.ctx.now))
        else:
            assert isinstance(step, Step)
            self._change(entry.id, rules.undo_begin(entry, step, s.get("idempotency_key"), by=BY,
                                                    started=self.now, job=name, approved=approved))

    def _body(self, step: Step, entry: Entry, name: str, label: str) -> dict[str, Any] | str:
        v = self.versions()
        try:
            data = step_input(self.ledger.name, step, entry, v, identity=self._identity)
        except PlanError as exc:
            return str(exc)
        text = step_text(data)
        problem = step_problem(text)
        if problem is not None:
            return problem
        if name in self.refused:
            return f"the Job {name} could not be created: {self.refused[name]}"
        called = v.tools.get(step.undo_tool or "")
        verifier = v.tools.get(step.verification.tool) if step.verification else None
        return job_body(name=name, ledger=self.ledger.name, uid=self.ledger.uid, entry=entry.id,
                        step=label, text=text, image=self.ctx.image,
                        deadline=deadline_seconds(data, called, verifier), manifests=(called, verifier),
                        trace=self._trace(entry))

    def _trace(self, entry: Entry) -> dict[str, str]:
        """The Job continues the undone call's trace when there is one and somewhere to send it."""
        env = dict(self.ctx.trace_env)
        if env and entry.traceparent:
            env["TRACEPARENT"] = entry.traceparent
        return env

    def _moot(self, s: dict[str, Any], entry: Entry) -> bool:
        """An older entry's undo removed the step's object (this rollback's, or one before):
        the entry is recorded moot, nothing is called (ledger/objects.py)."""
        v = self.versions()
        why = moot_reason(entry, list(self.entries.values()), lambda e: v.of(e)[0])
        if why is None:
            if s["action"] == "moot":  # planned moot; the entry changed meanwhile
                s.update(state="skipped", message=f"the entry is {entry.state} now and no "
                         "longer moot: ask for the rollback again to plan its undo")
                return True
            return False
        s.update(state="moot", outcome="moot", message=why, finished=self.now)
        self._change(entry.id, rules.moot(entry, why, self.ctx.now, by=BY))
        self._event("Normal", "StepMoot", f"{self._label(s)}: {why}")
        return True

    def _settled_steps(self) -> None:
        """A step whose entry a person settled by hand is ``settled`` (unless it succeeded):
        the conditions then agree with the world (a failed step settled is no failure)."""
        for s in self.steps:
            entry = self.entries.get(s["entry"])
            if entry is None or entry.state != "settled" or s["state"] in ("settled", "succeeded", "running"):
                continue
            by = entry.settled.by if entry.settled else "a person"
            why = entry.settled.reason if entry.settled else ""
            s.update(state="settled", message=f"settled by hand by {by}: {why}",
                     finished=s.get("finished") or self.now)
            self._event("Normal", "StepSettled", f"{self._label(s)}: {s['message']}")

    def _remember(self, record: dict[str, Any]) -> None:
        history, dropped = audit.bounded(audit.upsert(self.ledger.history if self._history is None
                                                      else self._history, record),
                                         self.ledger.dropped if self._dropped is None else self._dropped)
        self._history, self._dropped = history, dropped

    # ---- recording ------------------------------------------------------------------
    def _record(self, s: dict[str, Any]) -> None:
        name = str(s.get("job"))
        if name in self.refused:
            s.update(state="failed", message=f"the Job could not be created: {self.refused[name]}",
                     finished=self.now)
            if s["action"] != "lookup":
                self._change(s["entry"], rules.undo_end({"outcome": "not_started", "entry_state": "undo_failed",
                                                         "reason": s["message"], "finished": self.now}))
            self._event("Warning", "StepFailed", f"{self._label(s)}: {s['message']}")
            return
        job = self.jobs.get(str(name))
        if job is None:  # written ahead, not created yet (the operator stopped in between)
            entry = self.entries.get(s["entry"])
            if not (self.request.requested and self.rb and self.rb["generation"] == self.ledger.generation):
                s.update(state="cancelled", message="the request was withdrawn before its Job was created")
                return
            step = self._step_of(s, entry) if entry is not None else "the entry is gone"
            body = self._body(step, entry, str(name), str(s["index"])) \
                if isinstance(step, Step) and entry is not None else step
            if isinstance(body, dict):
                self.out.jobs.append(body)
            else:
                s.update(state="failed", message=str(body), finished=self.now)
            return
        if job.phase == "running":
            return
        result = parse_result(job.message)
        if s["action"] == "lookup":
            self._record_lookup(s, job, result)
        else:
            self._record_undo(s, job, result)
        kind = "Normal" if s["state"] == "succeeded" else "Warning"
        self._event(kind, "StepSucceeded" if kind == "Normal" else "StepFailed",
                    f"{self._label(s)}: {s.get('outcome')}: {s.get('message')}")

    def _record_undo(self, s: dict[str, Any], job: JobView, result: dict[str, Any] | None) -> None:
        if result is None:
            ok = job.phase == "succeeded"
            result = {"ok": ok, "outcome": "undone" if ok else "job_failed",
                      "entry_state": "undone" if ok else "undo_failed",
                      "reason": ("the Job succeeded; its result message was not found" if ok else
                                 f"the Job failed without a result ({job.why or 'no reason given'}): the "
                                 "undo may or may not have taken effect; asking again repeats it with "
                                 "the same idempotency key"), "finished": self.now}
        state = result.get("entry_state") or "undo_failed"
        result = {**result, "entry_state": state}
        s.update(state="succeeded" if result.get("ok") else "failed", outcome=result.get("outcome"),
                 message=str(result.get("reason") or ""), finished=result.get("finished") or self.now)
        if result.get("first_mismatch"):
            s["first_mismatch"] = result["first_mismatch"]
        # An undone entry no longer holds its idempotency key: the gateway breaks the key's
        # Lease when the next call with that key comes (gateway/keylocks.py).
        self._change(s["entry"], rules.undo_end(result))

    def _record_lookup(self, s: dict[str, Any], job: JobView, result: dict[str, Any] | None) -> None:
        if result is None:
            result = {"ok": False, "outcome": "lookup_failed", "reason": (
                f"the lookup's Job {'succeeded' if job.phase == 'succeeded' else 'failed'} without a "
                f"result ({job.why or 'no message'}): the entry stays uncertain; ask again"),
                "finished": self.now}
        s.update(state="succeeded" if result.get("ok") else "failed", outcome=result.get("outcome"),
                 message=str(result.get("reason") or ""), finished=result.get("finished") or self.now)
        self._lookup_end(s["entry"], result)

    def _lookup_end(self, entry_id: str, result: dict[str, Any]) -> None:
        entry = self.entries.get(entry_id)
        if entry is None or entry.state not in rules.LOOKUP_STATES:
            return  # resolved meanwhile: the lookup's result is not this pass's to record
        self._change(entry_id, rules.lookup_end(entry.state, result, self.ctx.now))

    def _finish_if_done(self) -> None:
        rb = self.rb
        if rb is None or rb.get("finished") or any(s["state"] not in TERMINAL for s in self.steps):
            return
        rb["finished"] = self.now
        failed = [s for s in self.steps if s["state"] in FAILED_STATES]
        if failed:
            self._event("Warning", DEGRADED, self._degraded_message(failed))
        elif any(s["state"] == "cancelled" for s in self.steps):
            self._event("Normal", Reason.CANCELLED, "the rollback was withdrawn: "
                        f"{_n(sum(1 for s in self.steps if s['state'] == 'cancelled'), 'step')} did not run")
        elif self._live_outside():
            self._event("Normal", Reason.PARTIALLY_ROLLED_BACK, self._partial_message())
        else:
            self._event("Normal", ROLLED_BACK, self._rolled_back_message())

    def _degraded_message(self, failed: list[dict[str, Any]]) -> str:
        parts = [f"{self._label(s)}: {s.get('first_mismatch') or s.get('message') or s['state']}" for s in failed[:5]]
        more = f" and {len(failed) - 5} more" if len(failed) > 5 else ""
        return f"{len(failed)} failed: " + "; ".join(parts) + more

    def _rolled_back_message(self) -> str:
        ran = sum(1 for s in self.steps if s["state"] == "succeeded")
        left = [f"{s['entry']} ({s['action']})" for s in self.steps if s["state"] == "left"]
        return f"{ran} step{'' if ran == 1 else 's'} ran" + (f"; left behind: {', '.join(left[:10])}" if left else "")

    def _live_outside(self) -> list[Entry]:
        """Live entries this rollback has no step for: not selected (``--entry``,
        ``--since``), or called after it was planned."""
        stepped = {s["entry"] for s in self.steps}
        return [e for e in live_entries(list(self.entries.values())) if e.id not in stepped]

    def _partial_message(self) -> str:
        outside = self._live_outside()
        ids = ", ".join(e.id for e in outside[:10]) + (f" and {len(outside) - 10} more" if len(outside) > 10 else "")
        return (f"{self._rolled_back_message()}; {len(outside)} other entr{'y' if len(outside) == 1 else 'ies'} "
                f"of the run still {'has' if len(outside) == 1 else 'have'} live effects ({ids}): "
                f"kubectl unwind rollback ledger/{self.ledger.name}{self._ns} --reason TEXT "
                f"undoes them, or kubectl unwind settle ledger/{self.ledger.name} ENTRY{self._ns} --reason TEXT "
                "records what was resolved by hand")

    # ---- conditions ---------------------------------------------------------------
    def _conditions(self) -> None:
        rb, gen, now = self.rb, self.ledger.generation, self.now
        if rb is None and not self.waiting:
            return
        conds = list(self.ledger.conditions)

        def put(type_: str, status: Any, reason: str, message: str) -> None:
            nonlocal conds
            conds = set_condition(conds, type_, status, reason, message or reason, gen, now)
        if self.waiting:
            put(PLANNED, "Unknown", Reason.WAITING_FOR_CALLS, self._waiting_message())
            put(ROLLED_BACK, "False", Reason.WAITING_FOR_CALLS, self._waiting_message())
            if conds != self.ledger.conditions:
                self.out.status["conditions"] = clean(conds)
            return
        assert rb is not None
        failed = [s for s in self.steps if s["state"] in FAILED_STATES]
        waiting_new = self.request.requested and rb["generation"] != gen
        if waiting_new:
            running = [s for s in self.steps if s["state"] == "running"]
            put(PLANNED, "Unknown", Reason.SUPERSEDING, f"a new request waits for {len(running)} "
                "running steps of the previous one")
        elif rb.get("error"):
            reason = str(rb.get("reason") or Reason.PLAN_FAILED)
            put(PLANNED, "False", reason, rb["error"])
            put(ROLLED_BACK, "False", reason, rb["error"])
        else:
            put(PLANNED, "True", Reason.PLANNED, f"frozen at {rb['planned']}: {self._summary()}")
        if not rb.get("error"):
            if rb.get("finished"):
                if failed:
                    put(ROLLED_BACK, "False", Reason.STEP_FAILED, self._degraded_message(failed))
                elif any(s["state"] == "cancelled" for s in self.steps):
                    put(ROLLED_BACK, "False", Reason.CANCELLED, "the request was withdrawn or replaced "
                        "before every step ran")
                elif self._live_outside():
                    put(ROLLED_BACK, "False", Reason.PARTIALLY_ROLLED_BACK, self._partial_message())
                else:
                    put(ROLLED_BACK, "True", Reason.ROLLED_BACK, self._rolled_back_message())
            else:
                done = sum(1 for s in self.steps if s["state"] in TERMINAL)
                running = [s for s in self.steps if s["state"] == "running"]
                waiting = [s for s in self.steps if s["state"] == "waiting"]
                if waiting and not running:
                    w = waiting[0]
                    put(ROLLED_BACK, "False", Reason.WAITING_FOR_APPROVAL, f"{self._label(w)} needs an "
                        f"Approval: kubectl unwind approve ledger/{self.ledger.name} --entry {w['entry']}{self._ns}")
                elif stuck := self._stuck(running):
                    if (get_condition(conds, ROLLED_BACK) or {}).get("message") != stuck:
                        self._event("Warning", Reason.STEP_STUCK, stuck)
                    put(ROLLED_BACK, "False", Reason.STEP_STUCK, stuck)
                else:
                    names = ", ".join(self._label(s) for s in running[:5]) or "none"
                    put(ROLLED_BACK, "False", Reason.IN_PROGRESS,
                        f"{done} of {_n(len(self.steps), 'step')} done; running: {names}")
        if failed:
            put(DEGRADED, "True", Reason.STEP_FAILED, self._degraded_message(failed))
        elif (get_condition(conds, DEGRADED) or {}).get("reason") != Reason.DECISIONS_WRITE_FAILED:
            put(DEGRADED, "False", Reason.NO_FAILURES, "no step failed")  # that one the reconcile clears
        if conds != self.ledger.conditions:
            self.out.status["conditions"] = clean(conds)

    def _stuck(self, running: list[dict[str, Any]]) -> str:
        """The running steps whose pods cannot start, each with its cause: named in the
        condition so a step is not silent until its Job's deadline."""
        found = [f"{self._label(s)} (Job {s.get('job')}) cannot start: {j.stuck}" for s in running
                 if (j := self.jobs.get(str(s.get("job")))) is not None and j.stuck]
        return "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")

    # ---- lost answers, on a timer -----------------------------------------------------
    def lookups(self) -> None:
        rb = self.rb
        if (rb is not None and not rb.get("finished")) or \
                (self.request.requested and (rb is None or rb["generation"] != self.ledger.generation)):
            return  # the rollback's own lookup steps do it
        started = 0
        for entry in list(self.entries.values()):
            if entry.state != "uncertain" or started >= self.ctx.parallelism \
                    or not rules.may_look_up(entry, self.ctx.now):
                continue  # (before its deadline the upstream may still apply the call)
            record = dict((entry.undo or {}).get("lookup") or {})
            name, attempts = record.get("job"), int(record.get("attempts") or 0)
            if name and not record.get("outcome"):
                job = self.jobs.get(str(name))
                if job is None:
                    started += self._lookup_job(entry, str(name), recreate=True)
                elif job.phase != "running":
                    result = parse_result(job.message) or {
                        "ok": False, "outcome": "lookup_failed", "finished": self.now,
                        "reason": f"the lookup's Job ended without a result ({job.why or 'no message'})"}
                    self._lookup_end(entry.id, result)
                    self.out.delete_jobs.append(job.name)
                    self._event(*_lookup_event(entry, result))
                continue
            if record.get("finished"):
                wait = min(self.ctx.lookup_every * 2 ** max(attempts - 1, 0), MAX_LOOKUP_WAIT)
                if self.ctx.now < parse_stamp(str(record["finished"])) + timedelta(seconds=wait):
                    continue
            name = lookup_job_name(self.ledger.name, self.ledger.uid, entry.id, attempts + 1)
            started += self._lookup_job(entry, name, recreate=False)

    def _lookup_job(self, entry: Entry, name: str, *, recreate: bool) -> int:
        step = plan_entry(entry, self.versions(), self.ctx.now)
        if step.action != "lookup":
            return 0  # no lookup declared (reported by `kubectl unwind plan`): nothing to do
        body = self._body(step, entry, name, "lookup")
        if isinstance(body, str):
            if not recreate:
                self._lookup_end(entry.id, {"outcome": "lookup_failed", "reason": body,
                                            "finished": self.now})
            return 0
        self.out.jobs.append(body)
        if not recreate:
            self._change(entry.id, rules.lookup_begin(entry, name, step.undo_tool, self.now,
                                                      self.ctx.now))
        return 1

    # ---- a failed pass, over -------------------------------------------------------
    def recovered(self) -> None:
        """A Degraded (or RolledBack) that says an earlier pass could not decide or write this
        ledger is cleared by this pass, which will be written; if it is not, the failure is
        recorded again (jobs.py)."""
        conds = list(self.out.status.get("conditions", self.ledger.conditions))
        before = list(conds)
        now, gen = self.now, self.ledger.generation
        for c in before:
            if c.get("reason") not in PASS_FAILURES:
                continue
            if c.get("type") == DEGRADED:
                conds = set_condition(conds, DEGRADED, "False", Reason.NO_FAILURES,
                                      "the operator decides and writes this ledger again", gen, now)
            elif c.get("type") == ROLLED_BACK and self.request.requested:
                conds = set_condition(conds, ROLLED_BACK, "False", Reason.IN_PROGRESS,
                                      "the request waits to be planned", gen, now)
            elif c.get("type") == ROLLED_BACK:
                conds = set_condition(conds, ROLLED_BACK, "False", Reason.CANCELLED,
                                      "the request was withdrawn before it was planned", gen, now)
        if conds != before:
            self.out.status["conditions"] = clean(conds)

    # ---- out ----------------------------------------------------------------------
    def result(self) -> Decision:
        if self.rb is not None:
            fresh = clean(self.rb)
            if fresh != self.original:
                self.out.status["rollback"] = fresh
        live = len(live_entries(list(self.entries.values())))
        if live != self.ledger.live:
            self.out.status["live"] = live
        if self.rb is not None:
            conds = self.out.status.get("conditions", self.ledger.conditions)
            result = get_condition(conds, ROLLED_BACK) if self.rb.get("finished") else None
            self._remember(audit.from_rollback(self.rb, result, self.now))
        if self._history is not None and (clean(self._history) != self.ledger.history
                                          or self._dropped != self.ledger.dropped):
            self.out.status["rollbacks"] = clean(self._history)
            if self._dropped:
                self.out.status["rollbacksDropped"] = self._dropped
        return self.out


# ---- entry changes: lifecycle writes (ledger/rollback_rules.py), one after the other ----

def _then(first: Change, second: Change) -> Change:
    return first.then(second)


def _lookup_event(entry: Entry, result: dict[str, Any]) -> tuple[str, str, str]:
    outcome = result.get("outcome")
    if outcome == "found":
        return "Normal", "LostAnswerFound", f"entry {entry.id} ({entry.tool}): {result.get('reason')}"
    if outcome == "not_found":
        return "Normal", "LostAnswerNotFound", f"entry {entry.id} ({entry.tool}): {result.get('reason')}"
    return "Warning", "LookupFailed", f"entry {entry.id} ({entry.tool}): {result.get('reason')}"


def _n(count: int, word: str) -> str:
    """``1 step``, ``2 steps``: a count in the right number."""
    return f"{count} {word}{'' if count == 1 else 's'}"
