"""The harness's adapters: how each actor of the protocol is driven. Thin, and all here.

Each calls the production code the way its real counterpart does, so a change of an
interface (a store update becoming a compare-and-set transition, a rollback fence) is
adapted here and nowhere else:

- ``GatewayProcess``: ``unwind.gateway.enforce.Gateway`` over the file store (its own
  ``FileStore`` and ``FileLocks`` on the shared folder, as a second ``unwind gateway`` on
  one laptop) or the cluster store (``ClusterStore`` and ``LeaseLocks`` through the fake
  API server), called with ``CallRequest``s; killed and restarted with empty memory;
- ``approve``: ``unwind approve --ledger`` (``FileStore.transition_sync``) or the operator
  writing an Approval's decision (``ClusterStore.transition``), both with
  ``decide.add_decision`` (the approver's lifecycle write);
- ``local_rollback``: ``unwind rollback --ledger`` (``undo.local.plan_local`` and
  ``execute``) as its own process;
- ``Operator``: the operator's rollback and lost-answer loop, ``jobs.py``'s gather,
  decide, write: ``operator.rollback.decide`` on what it reads (with the holders of the
  pending entries' key Leases), its changes and its fence applied to the pages and
  written back on the resourceVersion read (a conflict ends the pass), then the Jobs
  created; the Jobs run ``undo.runner.run_step`` (a pod each, one more pod
  when it fails, as ``backoffLimit: 1``) and end with its result as their message.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from unwind import API_GROUP, API_VERSION
from unwind.api.crd import storable_status
from unwind.gateway.enforce import CallRequest, CallResult, Gateway, Settings
from unwind.ledger.clusterstore import ClusterStore, LeaseLocks, lease_holder, lease_name
from unwind.ledger.decide import add_decision
from unwind.ledger.entry import ApprovalDecision, Entry, parse_stamp, stamp
from unwind.ledger.filestore import FileLocks
from unwind.ledger.plan import Selection
from unwind.ledger.rollback_rules import keyed_pending
from unwind.ledger.store import EntryMissing, Holder, Stale, StoreUnavailable
from unwind.operator.jobs import _apply, _entries_of
from unwind.operator.rollback import Context, JobView, LedgerView, decide
from unwind.undo.local import LocalLedger, Summary, execute, plan_local
from unwind.undo.runner import fit, parse_step, run_step
from unwind.upstream.secrets import LocalSecrets

from .tools import PERMISSION
from .upstream import ACTOR, SimUpstream
from .world import NS, FaultyStore, SimApi, World

SETTINGS = Settings(scopes=frozenset({PERMISSION}), actor=ACTOR)
LEDGERS = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{NS}/effectledgers"


class TracedLocks:
    """The key locks as they are; a broken lock is told to the trace and the ground (to tell
    bug 3's stale break from the others)."""

    def __init__(self, world: World, inner: Any) -> None:
        self.world, self.inner = world, inner

    async def acquire(self, name: str, holder: Holder) -> Holder | None:
        held: Holder | None = await self.inner.acquire(name, holder)
        return held

    async def release(self, name: str, holder: Holder) -> None:
        await self.inner.release(name, holder)

    async def peek(self, name: str) -> Holder | None:
        held: Holder | None = await self.inner.peek(name)
        return held

    async def break_stale(self, name: str, stale: Holder) -> bool:
        broken: bool = await self.inner.break_stale(name, stale)
        if broken:
            w = self.world
            age = (w.now() - parse_stamp(stale.since)).total_seconds()
            w.ground.broken_locks.append((w.loop.time(), name, age))
            w.trace(f"breaks the lock of {stale.run}/{stale.entry or '?'} ({age:.1f} s old)")
        return broken


class GatewayProcess:
    def __init__(self, world: World, name: str) -> None:
        self.world, self.name, self.generation = world, name, 0
        self.proc = ""
        self.gateway: Gateway | None = None

    def start(self) -> None:
        w = self.world
        if self.gateway is not None:
            return  # running (two restarts were asked for)
        self.generation += 1
        self.proc = f"{self.name}.{self.generation}"
        if w.kind == "file":
            store: Any = FaultyStore(w, w.file_store())
            locks: Any = FileLocks(w.root)
        else:
            api = SimApi(w)
            store, locks = ClusterStore(api, NS), LeaseLocks(api, NS)
        self.gateway = Gateway(w.catalogue, store, TracedLocks(w, locks), SimUpstream(w, self.proc),
                               LocalSecrets(), SETTINGS, clock=w.now)
        w.trace(f"{self.proc} starts")

    def kill(self) -> None:
        self.world.loop.kill(self.proc)
        self.world.trace(f"{self.proc} killed")
        self.gateway = None

    def call(self, req: CallRequest, done: Callable[[CallResult], None]) -> asyncio.Task[None] | None:
        gateway = self.gateway
        if gateway is None:
            return None

        async def one() -> None:
            done(await gateway.call(req))
        return self.world.loop.spawn(self.proc, one())


async def approve(world: World, run: str, entry_id: str, n: int) -> None:
    moment = world.now()
    made = ApprovalDecision(name=f"sim-approval-{n}", user="alice", groups=["finance"],
                            decision="approve", created=stamp(moment))
    change = add_decision(run, made, moment)
    try:
        if world.kind == "file":
            entry = world.file_store().transition_sync(run, entry_id, change)
        else:
            entry = await ClusterStore(SimApi(world), NS).transition(run, entry_id, change)
    except (EntryMissing, Stale, StoreUnavailable) as exc:
        world.trace(f"approve {run}/{entry_id}: {exc}")
        return
    world.trace(f"approve {run}/{entry_id}: {entry.approval.state if entry.approval else '?'}")


async def local_rollback(world: World, run: str, proc: str) -> Summary | None:
    path = world.root / f"{run}.json"
    if not path.exists():
        return None
    ledger = LocalLedger(path, run, run, world.file_store(), FileLocks(world.root))
    selection = Selection()
    plan = plan_local(ledger, world.versions, selection, world.now())
    world.trace(f"rollback {run} plans " + (", ".join(f"{s.entry}:{s.action}" for s in plan.steps)
                                             or "nothing"))

    def report(step: Any, result: dict[str, Any]) -> None:
        world.trace(f"rollback {run} {step.entry} {step.action}: {result.get('outcome')} -> "
                    f"{result.get('entry_state')}")
    summary = await execute(ledger, plan, world.versions, selection, by="oncall",
                            secrets=LocalSecrets(), report=report, sleep=asyncio.sleep,
                            clock=world.now, upstream=SimUpstream(world, proc))
    world.trace(f"rollback {run} ends {'ok' if summary.ok else 'stopped'}")
    return summary


async def request_rollback(world: World, run: str, n: int) -> bool:
    """``kubectl unwind rollback ledger/RUN``: a new request in the ledger's spec."""
    api = SimApi(world)
    try:
        status, obj = await api.request("GET", f"{LEDGERS}/{run}")
        if status != 200:
            return False
        obj["spec"]["rollback"] = {"requested": True, "reason": f"sim {n}",
                                   "requestedAt": stamp(world.now())}
        status, _ = await api.request("PUT", f"{LEDGERS}/{run}", obj)
    except OSError:
        return False
    world.trace(f"rollback {run} requested ({status})")
    return status == 200


class Operator:
    """The operator's rollback loop (leader), restarted with empty memory after a kill."""

    def __init__(self, world: World, runs: list[str]) -> None:
        self.world, self.runs, self.generation = world, runs, 0
        self.proc = ""

    def start(self) -> None:
        if self.proc and self.world.loop.alive(self.proc):
            return  # one leader at a time
        self.generation += 1
        self.proc = f"operator.{self.generation}"
        self.world.loop.spawn(self.proc, self._loop())

    def kill(self) -> None:
        self.world.loop.kill(self.proc)
        self.world.trace(f"{self.proc} killed")

    async def _loop(self) -> None:
        api = SimApi(self.world)
        while True:
            for run in self.runs:
                with contextlib.suppress(OSError):  # no answer: the next pass tries again
                    await self.one(api, run)
            await asyncio.sleep(self.world.rng.uniform(0.5, 3))

    async def one(self, api: SimApi, run: str) -> None:
        w = self.world
        pages: list[dict[str, Any]] = []
        name: str | None = run
        while name:
            status, obj = await api.request("GET", f"{LEDGERS}/{name}")
            if status != 200:
                break
            pages.append(obj)
            name = (obj.get("status") or {}).get("next")
        if not pages:
            return
        first = pages[0]
        spec, status_ = first.get("spec") or {}, first.get("status") or {}
        rb = status_.get("rollback")
        requested = bool((spec.get("rollback") or {}).get("requested"))
        busy = requested or (rb is not None and not rb.get("finished"))
        entries = [Entry.model_validate(e) for p in pages for e in _entries_of(p)]
        fenced = sum(1 for p in pages if (p.get("status") or {}).get("fence"))
        if not busy and not fenced and not any(e.state == "uncertain" for e in entries):
            return
        meta = first["metadata"]
        holders = await lease_holders(api, run, entries) if requested else None
        view = LedgerView(meta["name"], meta["uid"], run, int(meta.get("generation") or 1),
                          spec.get("rollback"), rb, list(status_.get("conditions") or []), entries,
                          None, live=status_.get("live"), pages=len(pages), fenced_pages=fenced,
                          holders=holders)
        ctx = Context(NS, w.now(), "sim/unwind:test", parallelism=2, lookup_every=5.0)
        d = decide(view, lambda: w.versions, job_views(w), {}, ctx)
        for page in reversed(pages):  # jobs.RollbackWorker._write: the first page last
            is_first = page is first
            written, changed = _apply(_entries_of(page), d.changes)
            new = dict(page.get("status") or {})
            fencing = (d.fence is not None and not new.get("fence")) or (d.lift_fence and "fence" in new)
            if not changed and not (is_first and d.status) and not fencing:
                continue
            if d.fence is not None and not new.get("fence"):
                new["fence"] = d.fence
            elif d.lift_fence:
                new.pop("fence", None)
            new["entries"] = written
            if written:
                new["lastState"] = written[-1].get("state")
            if is_first:
                new.update(d.status)
            code, _ = await api.request("PUT", f"{LEDGERS}/{page['metadata']['name']}/status",
                                        {**page, "status": storable_status("EffectLedger", new)})
            if code == 409:
                w.trace(f"operator {run}: conflict, decided again next pass")
                return
        for event in d.events:
            w.trace(f"operator {run}: {event.reason}: {event.message[:160]}")
        for body in d.jobs:
            create_job(w, body)
        for job in d.delete_jobs:
            w.jobs.pop(job, None)


async def lease_holders(api: SimApi, run: str, entries: list[Entry]) -> dict[str, Holder | None] | None:
    """Who holds each keyed pending entry's key (operator/jobs.py: RollbackWorker.holders)."""
    out: dict[str, Holder | None] = {}
    for entry_id, name in keyed_pending(run, entries).items():
        status, obj = await api.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{lease_name(name)}")
        if status == 404:
            out[entry_id] = None
        elif status == 200:
            out[entry_id] = lease_holder(obj)
        else:
            return None
    return out


def job_views(world: World) -> dict[str, JobView]:
    return {name: JobView(name, j["phase"], j["message"], j.get("why", ""))
            for name, j in world.jobs.items()}


async def run_pod(world: World, name: str, pod: int) -> None:
    """One pod of an undo Job: ``unwind undo-step`` with the step input of its env."""
    job = world.jobs.get(name)
    if job is None:
        return
    env = job["body"]["spec"]["template"]["spec"]["containers"][0]["env"]
    spec = parse_step(json.loads(next(e["value"] for e in env if e["name"] == "UNWIND_STEP")))
    result = await run_step(spec, SimUpstream(world, name), LocalSecrets(), sleep=asyncio.sleep,
                            clock=world.now)
    world.trace(f"job {name} pod {pod}: {result['action']} {result['outcome']}")
    job["message"] = fit(result)
    if result["ok"]:
        job["phase"] = "succeeded"
    elif pod < 2:
        start_pod(world, name, pod + 1)
    else:
        job.update(phase="failed", why="BackoffLimitExceeded")


def create_job(world: World, body: dict[str, Any]) -> None:
    name = body["metadata"]["name"]
    if name in world.jobs:
        return  # 409: it runs or ran
    world.jobs[name] = {"body": body, "phase": "running", "message": None}
    world.trace(f"job {name} created (step {body['metadata']['labels'].get(f'{API_GROUP}/step')})")
    start_pod(world, name, 1)


def start_pod(world: World, name: str, pod: int) -> None:
    world.jobs[name]["pod"] = (proc := f"pod-{name[-12:]}-{pod}")
    world.loop.spawn(proc, run_pod(world, name, pod))


def kill_pod(world: World, name: str) -> None:
    """A pod of the Job lost (a node gone): the Job controller starts one more, once."""
    job = world.jobs[name]
    world.loop.kill(job["pod"])
    world.trace(f"job {name}: pod {job['pod']} killed")
    pod = int(job["pod"].rsplit("-", 1)[1])
    if pod < 2:
        start_pod(world, name, pod + 1)
    else:
        job.update(phase="failed", why="BackoffLimitExceeded")
