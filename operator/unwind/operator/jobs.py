"""Rollbacks and lost answers in the cluster: the API calls, and one loop per namespace.

A change of an EffectLedger, or of a Job labelled ``unwind.dev/ledger``, marks the ledger
dirty; a timer marks every ledger of every known namespace dirty (lookups of lost
answers, retention). One loop per namespace then, on the leader only:

1. **gathers** each dirty ledger (its first page and every continuation page), the undo
   Jobs of the namespace with their pods' termination messages, and, only when a plan or a
   step needs them, the manifest versions (ControllerRevisions by checksum; today's set
   from the verified bundle) and the Approvals;
2. **decides** with pure code (``rollback.decide``, ``retention.decide``);
3. **writes** in this order: the entries and the first page's status (conditional on the
   resourceVersion read: a conflict ends the pass for that ledger and marks it dirty
   again), then the Jobs (409: it exists, it ran or runs), then deletions and Events. Writing the status first is what makes a restart safe: a Job is
   only ever created for a step already recorded as running, with its entry ``undoing``.

Each ledger is its own unit (ledgerfailures.py): one whose status the API server refuses,
or whose decision raises, gets a condition and an Event and a retry with a backoff of its
own, and the pass goes on with the next ledger. Only a failure to gather the namespace
(listing ledgers, Jobs, manifest versions) retries the namespace's pass whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from .. import API_GROUP, API_VERSION
from ..api.conditions import now_rfc3339
from ..api.crd import storable_status
from ..bundle import BundleError, load_bundle
from ..ledger import rollback_rules as rules
from ..ledger.clusterstore import lease_holder, lease_name
from ..ledger.entry import ApprovalDecision, Entry
from ..ledger.plan import Versions
from ..ledger.store import Holder, Stale
from ..manifest.canonical import checksum
from ..manifest.model import ToolManifest
from ..manifest.validate import validate_manifest
from ..registry.signing import TrustStore
from . import metrics
from .approval import ApprovalObject
from .identity import APPROVER, rollback_stamped, stamped_identity
from .kube import (
    APPROVALS,
    CHECKSUM_ANNOTATION,
    COMPONENT,
    LEDGERS,
    OWNER_LABEL,
    Kube,
    _discard,
    _json,
    _kept,
    _message,
    pages,
)
from .ledgerfailures import failed_ledger, permanent, retry_after, written_again
from .ledgers import decisions_for
from .objects import Event
from .retention import Retention
from .retention import decide as decide_retention
from .rollback import (
    PASS_FAILURES,
    Context,
    Decision,
    JobView,
    LedgerView,
    Reason,
    decide,
    live_entries,
)
from .undo_pods import job_problem
from .undojob import LEDGER_LABEL

log = logging.getLogger("unwind.operator.rollback")
LEDGER_PAGE = 20  # ledgers are large: list them a few at a time
ALL: frozenset[str] = frozenset()  # "every ledger of the namespace"



KIND = "EffectLedger"


def requester(namespace: str, meta: dict[str, Any], rollback: Any,
              trust: Callable[[], TrustStore]) -> dict[str, Any]:
    """Who asked for the rollback (``Requester``): the webhook's stamp, verified, or why not."""
    who, problem = stamped_identity("EffectLedger", namespace, rollback_stamped(str(meta["name"]), rollback),
                                    meta.get("annotations") or {}, trust(), meta)
    if who is None:
        return {"problem": problem}
    return {"user": who.user, "groups": list(who.groups)}

class Conflict(Exception):
    """A page changed since it was read: the ledger is decided again on the next pass."""


@dataclass
class PassResult:
    """What a pass over a namespace leaves to do: ledgers to look at again soon (a
    conflict, a Job still running), and ledgers whose own pass failed (retried with backoff)."""

    again: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class RollbackConfig:
    image: str = ""
    parallelism: int = 4
    lookup_every: float = 60.0
    retention_dry_run: bool = False
    window: float = 0.2
    trace_env: tuple[tuple[str, str], ...] = ()  # the operator's OTLP settings (undojob.trace_env)


@dataclass
class _Ledger:
    pages: list[dict[str, Any]]  # raw objects, first page first

    @property
    def first(self) -> dict[str, Any]:
        return self.pages[0]


def _entries_of(page: dict[str, Any]) -> list[dict[str, Any]]:
    return list((page.get("status") or {}).get("entries") or [])


def job_views(jobs: Iterable[dict[str, Any]], pods: Iterable[dict[str, Any]],
              events: Iterable[dict[str, Any]] = ()) -> dict[str, JobView]:
    """Each Job by name with the pods its controller made: a pod counts for a Job only when
    the Job is its controlling owner (by UID). Labels are anyone's to set: a pod someone
    labelled ``job-name`` with a hand-written termination message is not the step's result."""
    by_owner: dict[str, list[dict[str, Any]]] = {}
    for pod in pods:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == "Job" and ref.get("uid"):
                by_owner.setdefault(str(ref["uid"]), []).append(pod)
    events = list(events)
    return {j["metadata"]["name"]: job_view(j, by_owner.get(str(j["metadata"].get("uid")), []), events)
            for j in jobs}


def job_view(job: dict[str, Any], pods: list[dict[str, Any]], events: Iterable[dict[str, Any]] = ()) -> JobView:
    """How a Job ended, and the message of its succeeded pod (else of its latest pod)."""
    name = job["metadata"]["name"]
    status = job.get("status") or {}
    conds = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    phase = "succeeded" if "Complete" in conds else "failed" if "Failed" in conds else "running"
    why = ""
    if "Failed" in conds:
        why = f"{conds['Failed'].get('reason') or ''}: {conds['Failed'].get('message') or ''}".strip(": ")
    chosen = sorted(pods, key=lambda p: (((p.get("status") or {}).get("phase") == "Succeeded"),
                                         p["metadata"].get("creationTimestamp") or ""))
    message = None
    for pod in reversed(chosen):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            if term.get("message"):
                message = str(term["message"])
                break
        if message:
            break
    stuck = job_problem(pods, events) if phase == "running" else ""
    return JobView(name, phase, message, why, stuck)


class RollbackWorker:
    """The synchronous part: one pass over a namespace (run in a thread)."""

    def __init__(self, kube: Kube, config: RollbackConfig, trust: Callable[[], TrustStore]) -> None:
        self.kube, self.config, self.trust = kube, config, trust
        api = kube.core.api_client
        self.custom: Any = kube.custom
        self.core: Any = kube.core
        self.batch: Any = client.BatchV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.refused: dict[tuple[str, str], str] = {}  # (namespace, job) -> why (in memory)

    # ---- gather ---------------------------------------------------------------------
    def _get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return dict(_json(self.custom.get_namespaced_custom_object(
                API_GROUP, API_VERSION, namespace, LEDGERS, name, _preload_content=False)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _ledger(self, namespace: str, first: dict[str, Any]) -> _Ledger:
        pages, seen = [first], {first["metadata"]["name"]}
        nxt = (first.get("status") or {}).get("next")
        while nxt and nxt not in seen:
            seen.add(nxt)
            page = self._get(namespace, nxt)
            if page is None:
                break
            pages.append(page)
            nxt = (page.get("status") or {}).get("next")
        return _Ledger(pages)

    def first_pages(self, namespace: str, names: frozenset[str]) -> Iterator[dict[str, Any]]:
        """The first page of each named ledger (a continuation page names its run), or of
        every ledger when ``names`` is empty."""
        if not names:
            for obj in pages(self.custom.list_namespaced_custom_object, API_GROUP, API_VERSION,
                             namespace, LEDGERS, limit=LEDGER_PAGE):
                if int((obj.get("spec") or {}).get("page") or 1) == 1:
                    yield obj
            return
        runs = {n.split(".p", 1)[0] if ".p" in n else n for n in names}
        for run in sorted(runs):
            found = self._get(namespace, run)
            if found is not None:
                yield found

    def jobs(self, namespace: str) -> dict[str, JobView]:
        jobs = list(pages(self.batch.list_namespaced_job, namespace, label_selector=LEDGER_LABEL))
        pods = list(pages(self.core.list_namespaced_pod, namespace, label_selector=LEDGER_LABEL))
        # Events only while an undo pod has not started: a missing Secret shows nowhere else
        waiting = any((p.get("status") or {}).get("phase") == "Pending" for p in pods)
        return job_views(jobs, pods, self._pod_warnings(namespace) if waiting else [])

    def _pod_warnings(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's Warning Events about pods; none (logged) where the operator may not
        list Events (a chart older than this rule): stuck pods then go unnamed, steps still run."""
        try:
            return list(pages(self.core.list_namespaced_event, namespace,
                              field_selector="involvedObject.kind=Pod,type=Warning"))
        except ApiException as exc:
            if exc.status != 403:
                raise
            log.warning("namespace %s: may not list Events (%s): undo pods that cannot start are "
                        "reported only by their container states", namespace, exc.reason)
            return []

    def versions(self, namespace: str) -> Versions:
        """Every version recorded in the namespace by checksum (ControllerRevisions whose
        data matches their checksum), and today's enforced set from the verified bundle."""
        by_checksum: dict[str, ToolManifest] = {}
        for r in pages(self.kube.apps.list_namespaced_controller_revision, namespace,
                             label_selector=OWNER_LABEL):
            claimed = ((r["metadata"].get("annotations") or {}).get(CHECKSUM_ANNOTATION))
            m, issues = validate_manifest(r.get("data") or {})
            if m is not None and not issues and checksum(m) == claimed:
                by_checksum[claimed] = m
        tools: dict[str, ToolManifest] = {}
        data, _, _ = self.kube._bundle(namespace)
        if data:
            try:
                tools = dict(load_bundle(data, self.trust(), namespace=namespace).manifests)
            except BundleError as exc:
                log.warning("namespace %s: the bundle does not verify (%s): undo steps cannot be "
                            "built until it does", namespace, exc)
        for m in tools.values():
            by_checksum.setdefault(checksum(m), m)
        return Versions(by_checksum, tools)

    def decisions(self, namespace: str, names: list[str]) -> dict[str, list[ApprovalDecision]]:
        approvals = [ApprovalObject(a["metadata"]["name"], a["metadata"].get("creationTimestamp") or "",
                                    a.get("spec"), _kept(a["metadata"], APPROVER.all()))
                     for a in pages(self.custom.list_namespaced_custom_object, API_GROUP,
                                          API_VERSION, namespace, APPROVALS)]
        out: dict[str, list[ApprovalDecision]] = {}
        for name in names:
            for entry, found in decisions_for(name, namespace, approvals, self.trust()).items():
                out.setdefault(entry, []).extend(found)
        for found in out.values():
            found.sort(key=lambda d: (d.created, d.decision != "deny", d.name))
        return out

    # ---- one pass ---------------------------------------------------------------------
    def reconcile(self, namespace: str, names: frozenset[str]) -> PassResult:
        """Decide and write every dirty ledger, each on its own: one that fails is recorded
        on that ledger (``_failed``) and the pass goes on."""
        out = PassResult()
        cache: dict[str, Any] = {}

        def versions() -> Versions:
            if "versions" not in cache:
                cache["versions"] = _gathered(self.versions, namespace)
            return cache["versions"]  # type: ignore[no-any-return]

        def jobs() -> dict[str, JobView]:
            if "jobs" not in cache:
                cache["jobs"] = _gathered(self.jobs, namespace)
            return cache["jobs"]  # type: ignore[no-any-return]
        now = datetime.now(UTC)
        full = not names
        for first in self.first_pages(namespace, names):
            name = first["metadata"]["name"]
            try:
                if self._one(namespace, first, versions, jobs, now, full):
                    out.again.add(name)
            except Conflict:
                out.again.add(name)
            except _Refused as exc:
                out.failed.add(name)
                self._failed(namespace, first, Reason.STATUS_WRITE_FAILED, str(exc))
            except ApiException as exc:
                if exc.status in (404, 409):
                    out.again.add(name)
                elif permanent(exc.status):
                    out.failed.add(name)
                    self._failed(namespace, first, Reason.RECONCILE_FAILED,
                                 f"{exc.status} {exc.reason}: {_message(exc)}")
                else:  # 429, 5xx: this ledger again, later; the others now
                    out.failed.add(name)
                    log.warning("namespace %s: ledger %s: %s %s, retried with backoff", namespace,
                                name, exc.status, exc.reason)
            except _Gather:
                raise
            except Exception as exc:  # a bug met by this ledger's data must not stop the others
                out.failed.add(name)
                log.exception("namespace %s: ledger %s could not be decided", namespace, name)
                self._failed(namespace, first, Reason.RECONCILE_FAILED, f"{type(exc).__name__}: {exc}")
        return out

    def _failed(self, namespace: str, first: dict[str, Any], reason: str, why: str) -> None:
        mark_failed(self.custom, self.core, namespace, first, reason, why)

    def _one(self, namespace: str, first: dict[str, Any], versions: Callable[[], Versions],
             jobs: Callable[[], dict[str, JobView]], now: datetime, full: bool) -> bool:
        status = first.get("status") or {}
        spec = first.get("spec") or {}
        requested = bool((spec.get("rollback") or {}).get("requested"))
        rb = status.get("rollback")
        busy = requested or (rb is not None and not rb.get("finished"))
        ledger = self._ledger(namespace, first)
        entries: list[Entry] = []
        for page in ledger.pages:
            for raw in _entries_of(page):
                try:
                    entries.append(Entry.model_validate(raw))
                except ValidationError:
                    continue  # a malformed entry is reported by `kubectl unwind plan`
        # a lost answer: the timer's lookup settles it. A pending entry (its gateway stopped
        # during the call) is left to a rollback's plan, which first asks whether its key's
        # lock ever named it: a lookup alone would find another entry's effect by the key and
        # have it undone twice (the simulation's seed 569)
        uncertain = any(e.state == "uncertain" for e in entries)
        fenced = sum(1 for p in ledger.pages if (p.get("status") or {}).get("fence"))
        # LIVE is counted from the entries on every change seen, not only on the timer
        stale_live = len(live_entries(entries)) != status.get("live")
        if not busy and not uncertain and not full and not fenced and not stale_live:
            return False
        metrics.LEDGERS_CHECKED.labels(namespace).inc()
        meta = first["metadata"]
        view = LedgerView(meta["name"], meta["uid"], str(spec.get("run") or meta["name"]),
                          int(meta.get("generation") or 1), spec.get("rollback"), rb,
                          list(status.get("conditions") or []), entries,
                          requester(namespace, meta, spec.get("rollback"), self.trust) if requested else None,
                          live=status.get("live"), pages=len(ledger.pages), fenced_pages=fenced,
                          holders=self.holders(namespace, str(spec.get("run") or meta["name"]), entries)
                          if requested else None,
                          history=list(status.get("rollbacks") or []),
                          dropped=int(status.get("rollbacksDropped") or 0))
        decisions = self._approvals_needed(namespace, ledger, rb)
        refused = {n: w for (ns, n), w in self.refused.items() if ns == namespace}
        ctx = Context(namespace, now, self.config.image, self.config.parallelism, self.config.lookup_every,
                      self.config.trace_env)
        decision = decide(view, versions, jobs() if (busy or uncertain) else {}, decisions, ctx, refused)
        delete = False
        if full and not busy:
            kept = decision.status.get("conditions", view.conditions)
            retention: Retention = decide_retention(view, meta.get("creationTimestamp") or "", versions,
                                                    now, dry_run=self.config.retention_dry_run,
                                                    grace=self.config.lookup_every, conditions=kept)
            if retention.conditions is not None:
                decision.status["conditions"] = retention.conditions
            decision.events.extend(retention.events)
            delete = retention.delete
        if delete:
            self._delete_ledger(namespace, ledger)
            self._events(namespace, meta, decision.events)
            return False
        if decision.empty:
            return False
        self._write(namespace, ledger, decision)
        return decision.waiting or any(s.get("state") == "running" for s in
                                       (decision.status.get("rollback") or rb or {}).get("steps") or [])

    def holders(self, namespace: str, run: str, entries: list[Entry]) -> dict[str, Holder | None] | None:
        """Who holds the key of each keyed pending entry: the Leases the gateways take (any
        run's). None when they cannot be read: the planner then asks the ledger alone."""
        out: dict[str, Holder | None] = {}
        for entry_id, name in rules.keyed_pending(run, entries).items():
            try:
                lease = self.coordination.read_namespaced_lease(lease_name(name), namespace,
                                                                _preload_content=False)
            except ApiException as exc:
                if exc.status == 404:
                    out[entry_id] = None
                    continue
                log.warning("namespace %s: the Lease of entry %s cannot be read (%s %s): the "
                            "plan asks the ledger alone who held its key", namespace, entry_id,
                            exc.status, exc.reason)
                return None
            out[entry_id] = lease_holder(_json(lease))
        return out

    def _approvals_needed(self, namespace: str, ledger: _Ledger,
                          rb: dict[str, Any] | None) -> dict[str, list[ApprovalDecision]]:
        steps = (rb or {}).get("steps") or []
        if not any(s.get("requires_approval") and s.get("state") in ("pending", "waiting") for s in steps):
            return {}
        names = [p["metadata"]["name"] for p in ledger.pages]
        return _gathered(lambda ns: self.decisions(ns, names), namespace)  # type: ignore[no-any-return]

    # ---- write ------------------------------------------------------------------------
    def _write(self, namespace: str, ledger: _Ledger, d: Decision) -> None:
        for page in reversed(ledger.pages):  # the first page (with the rollback) last
            first = page is ledger.first
            entries, changed = _apply(_entries_of(page), d.changes)
            status = dict(page.get("status") or {})
            # the fence goes into every page, each write conditional on the page as read: a
            # gateway's write-ahead to any page either came before (and is in what was read)
            # or sees the fence
            fencing = (d.fence is not None and not status.get("fence")) or \
                (d.lift_fence and "fence" in status)
            if not changed and not (first and d.status) and not fencing:
                continue
            if d.fence is not None and not status.get("fence"):
                status["fence"] = d.fence
            elif d.lift_fence:
                status.pop("fence", None)
            status["entries"] = entries
            if entries:
                status["lastState"] = entries[-1].get("state")
            if first:
                status.update(d.status)
            body = {**page, "status": storable_status(KIND, status)}
            try:
                _discard(self.custom.replace_namespaced_custom_object_status(
                    API_GROUP, API_VERSION, namespace, LEDGERS, page["metadata"]["name"], body,
                    _preload_content=False))
            except ApiException as exc:
                if exc.status == 409:
                    raise Conflict(page["metadata"]["name"]) from None
                if permanent(exc.status):
                    raise _Refused(f"{exc.status} {exc.reason}: {_message(exc)}") from exc
                raise
        for body in d.jobs:
            self._create_job(namespace, body)
        for name in d.delete_jobs:
            with contextlib.suppress(ApiException):
                self.batch.delete_namespaced_job(name, namespace, propagation_policy="Background")
        self._events(namespace, ledger.first["metadata"], d.events)

    def _create_job(self, namespace: str, body: dict[str, Any]) -> None:
        name = body["metadata"]["name"]
        try:
            _discard(self.batch.create_namespaced_job(namespace, body, _preload_content=False))
            log.info("namespace %s: created Job %s", namespace, name)
        except ApiException as exc:
            if exc.status == 409:
                return  # created before: it runs or ran
            if exc.status is not None and 400 <= exc.status < 500 and exc.status != 429:
                self.refused[(namespace, name)] = f"{exc.status} {exc.reason}: {_message(exc)}"
                log.warning("namespace %s: Job %s refused: %s", namespace, name, self.refused[(namespace, name)])
                return
            raise

    def _delete_ledger(self, namespace: str, ledger: _Ledger) -> None:
        for page in reversed(ledger.pages):
            with contextlib.suppress(ApiException):
                self.custom.delete_namespaced_custom_object(
                    API_GROUP, API_VERSION, namespace, LEDGERS, page["metadata"]["name"])
        log.info("namespace %s: deleted ledger %s (%d pages) past its retention", namespace,
                 ledger.first["metadata"]["name"], len(ledger.pages))

    def _events(self, namespace: str, meta: dict[str, Any], events: list[Event]) -> None:
        post_events(self.core, namespace, meta, events)


def post_events(core: Any, namespace: str, meta: dict[str, Any], events: list[Event]) -> None:
    """Events about one ledger (``meta``): a courtesy, never a failure of the pass."""
    for event in events:
        now = now_rfc3339()
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{event.name[:200].rstrip('.-')}.", "namespace": namespace},
            "involvedObject": {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": event.kind,
                               "name": event.name, "namespace": namespace, "uid": meta.get("uid", "")},
            "type": event.type, "reason": event.reason, "message": event.message[:1024],
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        try:
            _discard(core.create_namespaced_event(namespace, body, _preload_content=False))
        except ApiException as exc:  # an event is a courtesy
            log.warning("could not post event %s/%s: %s", namespace, event.name, exc.reason)


class _Refused(Exception):
    """The API server refused a page's status: only a change of what is written can fix it."""


class _Gather(Exception):
    """Gathering the namespace failed (not one ledger's fault): the pass is retried whole."""


def _gathered(read: Callable[[str], Any], namespace: str) -> Any:
    try:
        return read(namespace)
    except Exception as exc:
        raise _Gather(f"{type(exc).__name__}: {exc}") from exc


def storable_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """An entry as the API server stores it unchanged (api.crd.storable): an approval
    decision given without a reason has ``reason: ""`` in the model, which the API server
    refuses as ``null``; left out, it reads back the same."""
    return storable_status(KIND, {"entries": [entry]})["entries"][0]  # type: ignore[no-any-return]


def _write_conditions(custom: Any, namespace: str, obj: dict[str, Any], conditions: list[dict[str, Any]]) -> None:
    """Replace the ledger's conditions in its status as read (what was refused is not in
    it), conditional on its resourceVersion (the operator may update statuses, not patch
    them); a conflict is left to the next retry."""
    status = {**(obj.get("status") or {}), "conditions": conditions}
    try:
        _discard(custom.replace_namespaced_custom_object_status(
            API_GROUP, API_VERSION, namespace, LEDGERS, obj["metadata"]["name"],
            {**obj, "status": storable_status(KIND, status)}, _preload_content=False))
    except ApiException as exc:  # the Event and the log still say it
        log.warning("namespace %s: ledger %s: its conditions could not be written either: %s %s",
                    namespace, obj["metadata"]["name"], exc.status, exc.reason)


def mark_failed(custom: Any, core: Any, namespace: str, obj: dict[str, Any], reason: str, why: str) -> None:
    """Record on ledger ``obj`` (as read) that the operator's work on it failed: its
    conditions written into the status as read (what was refused is not in it), and a
    Warning Event; both only when new (ledgerfailures.failed_ledger)."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    rb, generation = status.get("rollback") or {}, int(meta.get("generation") or 1)
    # RolledBack too when it is the rollback's own pass that failed
    rolling_back = reason in PASS_FAILURES and bool((spec.get("rollback") or {}).get("requested")) \
        and not (rb.get("generation") == generation and rb.get("finished"))
    log.warning("namespace %s: ledger %s: %s: %s; the other ledgers go on", namespace, meta["name"], reason, why)
    found = failed_ledger(meta["name"], generation, list(status.get("conditions") or []),
                          rolling_back, reason, why, now_rfc3339())
    if found.conditions is not None:
        _write_conditions(custom, namespace, obj, found.conditions)
    post_events(core, namespace, meta, found.events)


def mark_written(custom: Any, namespace: str, obj: dict[str, Any], reason: str) -> None:
    """Clear a failure with ``reason`` recorded on ledger ``obj`` once its write went through."""
    conds = written_again(int(obj["metadata"].get("generation") or 1),
                          list((obj.get("status") or {}).get("conditions") or []), reason, now_rfc3339())
    if conds is not None:
        _write_conditions(custom, namespace, obj, conds)


def _apply(entries: list[dict[str, Any]], changes: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """The page's entries with the changes applied to the entries they name (a change that
    finds its entry in another state raises Stale and is dropped)."""
    out, changed = [], False
    for raw in entries:
        change = changes.get(str(raw.get("id")))
        if change is None:
            out.append(raw)
            continue
        try:
            new = storable_entry(change(Entry.model_validate(raw)).to_json())
        except (Stale, ValidationError):
            out.append(raw)
            continue
        changed = changed or new != raw
        out.append(new)
    return out, changed


@dataclass
class RollbackLoop:
    """Dirty ledgers by namespace, one coalescing loop per namespace (leader only), and the
    timer that looks at every ledger (lost answers, retention)."""

    worker: RollbackWorker
    leading: asyncio.Event | None = None
    dirty: dict[str, set[str]] = field(default_factory=dict)  # namespace -> names (empty: all)
    wakeups: dict[str, asyncio.Event] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    known: set[str] = field(default_factory=set)  # namespaces that hold ledgers
    poll: float = 5.0  # look again at ledgers with running steps (a missed Job event)
    failures: dict[tuple[str, str], int] = field(default_factory=dict)  # a ledger's failed passes in a row

    def seen(self, namespace: str) -> None:
        """A namespace with ledgers: the timer passes over it."""
        self.known.add(namespace)

    def touch(self, namespace: str, name: str | None = None) -> None:
        """Mark a ledger (None: every ledger) of the namespace dirty."""
        names = self.dirty.get(namespace)
        if name is None:
            self.dirty[namespace] = set()
        elif names is None:
            self.dirty[namespace] = {name}
        elif names:
            names.add(name)
        self.wakeups.setdefault(namespace, asyncio.Event()).set()
        if namespace not in self.tasks or self.tasks[namespace].done():
            self.tasks[namespace] = asyncio.create_task(self._loop(namespace), name=f"unwind-rollback:{namespace}")

    async def _loop(self, namespace: str) -> None:
        wake = self.wakeups[namespace]
        backoff = 1.0
        while True:
            await wake.wait()
            await asyncio.sleep(self.worker.config.window)  # let a burst of events settle
            wake.clear()
            if self.leading is not None:
                await self.leading.wait()
            names = self.dirty.pop(namespace, None)
            if names is None:
                continue
            try:
                result = await asyncio.to_thread(self.worker.reconcile, namespace, frozenset(names))
                backoff = 1.0
            except Exception as exc:  # gathering failed: retried, temporary trouble must not stop the loop
                log.warning("rollback pass of namespace %s could not gather its ledgers, retrying in "
                            "%.0fs: %s", namespace, backoff, exc)
                self._merge(namespace, names)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 60.0)
                wake.set()
                continue
            self._schedule(namespace, names, result)

    def _schedule(self, namespace: str, names: set[str], result: PassResult) -> None:
        """Ledgers to look at again: soon (``again``), or with a backoff of their own (failed)."""
        loop = asyncio.get_running_loop()
        for name in (names or set()) - result.failed:
            self.failures.pop((namespace, name), None)
        if not names:  # a pass over every ledger: whoever did not fail is over it
            for key in [k for k in self.failures if k[0] == namespace and k[1] not in result.failed]:
                del self.failures[key]
        for name in sorted(result.failed):
            count = self.failures[(namespace, name)] = self.failures.get((namespace, name), 0) + 1
            loop.call_later(retry_after(count, self.poll), self._again, namespace, {name})
        if result.again:
            loop.call_later(self.poll, self._again, namespace, result.again)

    def _merge(self, namespace: str, names: set[str]) -> None:
        if not names:
            self.dirty[namespace] = set()
        elif self.dirty.get(namespace):
            self.dirty[namespace] |= names
        elif namespace not in self.dirty:
            self.dirty[namespace] = set(names)

    def _again(self, namespace: str, names: set[str]) -> None:
        for name in names:
            self.touch(namespace, name)

    async def timer(self, every: float) -> None:
        """Every ``every`` seconds, every ledger of every namespace seen."""
        while True:
            await asyncio.sleep(every)
            for namespace in sorted(self.known | set(self.tasks)):
                self.touch(namespace)

    async def stop(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)


def relevant(body: dict[str, Any]) -> bool:
    """Whether a ledger event needs a pass: a rollback asked for or running, a fence whose
    request was withdrawn (to lift it), a lost answer, or a LIVE count the entries no longer
    give (a run's only page whose count is off, or any write to a continuation page)."""
    spec, status = body.get("spec") or {}, body.get("status") or {}
    if (spec.get("rollback") or {}).get("requested") or status.get("fence"):
        return True
    rb = status.get("rollback")
    if rb is not None and not rb.get("finished"):
        return True
    entries = [e for e in status.get("entries") or [] if isinstance(e, dict)]
    if any(e.get("state") == "uncertain" for e in entries):
        return True
    if int(spec.get("page") or 1) > 1:
        return True
    return not status.get("next") and rules.live_count(entries) != (status.get("live") or 0)
