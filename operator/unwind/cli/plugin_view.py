"""The pure parts of the kubectl plugin: parse what a user typed, and turn the objects
kubectl returned into rows and sentences. No process is run here (plugin_cmds.py does the
calls), so everything that decides what is shown is tested without a cluster.

The state of a manifest is read from the conditions the operator wrote, by their
documented reasons (reconcile.Reason); the plugin never re-decides an approval.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..bundle import INDEX_KEY
from ..operator.identity import APPLIED, APPROVER
from ..operator.reconcile import Reason

# What the operator writes on each ControllerRevision (operator/kube.py; a unit test
# keeps the two in step without importing the Kubernetes client here).
OWNER_LABEL = "unwind.dev/toolmanifest-uid"
CHECKSUM_ANNOTATION = "unwind.dev/checksum"
AUTHOR_ANNOTATION = "unwind.dev/applied-by"

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
MAX_NAME = 253
_KINDS = {"ToolManifest": ("tm", "toolmanifest", "toolmanifests"),
          "EffectLedger": ("ledger", "effectledger", "effectledgers")}
RESOURCE = {"ToolManifest": "toolmanifests.unwind.dev", "EffectLedger": "effectledgers.unwind.dev"}
SHORT = {"ToolManifest": "tm", "EffectLedger": "ledger"}


class UsageError(ValueError):
    """What the user typed cannot be used; the message says what to type instead."""


def is_object_name(name: str) -> bool:
    return len(name) <= MAX_NAME and bool(_DNS_SUBDOMAIN.fullmatch(name))


@dataclass(frozen=True)
class Target:
    kind: str  # ToolManifest | EffectLedger
    name: str

    @property
    def resource(self) -> str:
        return RESOURCE[self.kind]

    def __str__(self) -> str:
        return f"{SHORT[self.kind]}/{self.name}"


def parse_target(text: str, kinds: Sequence[str] = ("ToolManifest", "EffectLedger")) -> Target:
    """``tm/NAME`` (also toolmanifest/, toolmanifests/, with or without ``.unwind.dev``) or
    ``ledger/NAME`` (also effectledger/, effectledgers/)."""
    forms = " or ".join(f"{SHORT[k]}/NAME" for k in kinds)
    kind_text, slash, name = text.partition("/")
    if not slash:
        raise UsageError(f"{text!r}: name the kind and the object, as {forms}")
    kind_text = kind_text.lower().removesuffix(".unwind.dev")
    kind = next((k for k in kinds if kind_text in _KINDS[k]), None)
    if kind is None:
        raise UsageError(f"{text!r}: {kind_text!r} is not a kind this command takes; use {forms}")
    if not is_object_name(name):
        raise UsageError(f"{text!r}: {name!r} is not a Kubernetes object name (lower-case letters, "
                         "digits, '-' and '.', at most 253)")
    return Target(kind, name)


def parse_version(text: str) -> int:
    """``2`` or ``v2``."""
    digits = text[1:] if text[:1] in ("v", "V") else text
    if not re.fullmatch(r"[0-9]+", digits) or int(digits) < 1:
        raise UsageError(f"{text!r} is not a version: give a number such as 2 or v2")
    return int(digits)


def approval_name(target: str, decision: str, detail: str, token: str) -> str:
    """``<target>-<decision>-<detail>-<token>``, the target shortened so the whole stays a
    valid object name. ``detail`` is ``v<version>`` or a ledger entry id (made name-safe);
    ``token`` is random hex: the client cannot know who the API server will say it is, so
    the name cannot carry the approver (the APPROVER column, stamped, does)."""
    safe = re.sub(r"[^a-z0-9]+", "-", detail.lower()).strip("-")[:40].strip("-") or "entry"
    suffix = f"-{decision}-{safe}-{token}"
    return target[:MAX_NAME - len(suffix)].rstrip("-.") + suffix


def already_decided(created: Mapping[str, Any], approvals: Iterable[Mapping[str, Any]],
                    approver_key: str) -> Mapping[str, Any] | None:
    """An earlier Approval by the same (stamped) approver with the same decision on the same
    target (a manifest's checksum, or a ledger entry) as ``created``: a second one changes
    nothing, and the person should be told so rather than see it accepted silently."""
    who = annotations_of(created).get(approver_key)
    spec = part(created, "spec")
    if not who:
        return None
    earlier = [a for a in approvals if meta(a).get("name") != meta(created).get("name")
               and annotations_of(a).get(approver_key) == who
               and part(a, "spec").get("target") == spec.get("target")
               and part(a, "spec").get("decision") == spec.get("decision")]
    return min(earlier, key=lambda a: (str(meta(a).get("creationTimestamp") or ""),
                                       str(meta(a).get("name") or "")), default=None)


def short(checksum: str | None) -> str:
    return checksum.removeprefix("sha256:")[:12] if checksum else "-"


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Aligned columns as kubectl prints them: upper-case headers, three spaces between."""
    cells = [[str(h) for h in headers], *([("-" if c is None else str(c)) for c in r] for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)


def described(pairs: Sequence[tuple[str, object]]) -> str:
    """``Key:  value`` lines, values aligned, as `kubectl describe` prints them."""
    width = max(len(k) for k, _ in pairs) + 2
    return "\n".join(f"{(k + ':').ljust(width)}{'-' if v is None else v}" for k, v in pairs)


# ---- reading objects ------------------------------------------------------------------

def part(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    """``obj[key]`` when it is a mapping, else empty: objects from outside may be odd."""
    value = obj.get(key)
    return value if isinstance(value, Mapping) else {}


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return part(obj, "metadata")


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return part(meta(obj), "annotations")


def status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return part(obj, "status")


def conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    found = status(obj).get("conditions") or []
    return {str(c.get("type")): c for c in found if isinstance(c, Mapping)}


def settled(obj: Mapping[str, Any]) -> bool:
    """The status describes the current spec (the operator has seen this generation)."""
    observed = status(obj).get("observedGeneration")
    return observed is not None and observed == meta(obj).get("generation")


def author(obj: Mapping[str, Any]) -> str | None:
    """Who last changed the spec, as the webhook stamped it."""
    return annotations_of(obj).get(APPLIED.user) or None


@dataclass(frozen=True)
class Decision:
    name: str
    verb: str  # approve | deny
    approver: str
    created: str
    reason: str = ""


def decisions(approvals: Iterable[Mapping[str, Any]], manifest: str) -> dict[str, list[Decision]]:
    """The Approvals of one ToolManifest by checksum, oldest first. The approver is the
    webhook's stamp (the webhook refuses any other); an Approval without one predates the
    webhooks and is shown as unstamped (the operator does not count it)."""
    out: dict[str, list[Decision]] = {}
    ordered = sorted(approvals, key=lambda a: (str(meta(a).get("creationTimestamp") or ""),
                                               str(meta(a).get("name") or "")))
    for a in ordered:
        spec = part(a, "spec")
        target = part(spec, "target")
        if target.get("toolManifest") != manifest or not isinstance(target.get("checksum"), str):
            continue
        who = annotations_of(a).get(APPROVER.user) or "(unstamped)"
        out.setdefault(target["checksum"], []).append(
            Decision(str(meta(a).get("name")), str(spec.get("decision")), who,
                     str(meta(a).get("creationTimestamp") or ""), str(spec.get("reason") or "")))
    return out


@dataclass(frozen=True)
class Enforced:
    """The version of a manifest the namespace bundle holds."""

    version: int
    checksum: str
    key_id: str | None


def enforced_from_index(index_text: str, manifest: str) -> Enforced | None:
    """The bundle index entry that came from ToolManifest ``manifest``."""
    try:
        index = json.loads(index_text)
    except ValueError:
        return None
    if not isinstance(index, dict):
        return None
    sig = index.get("signature")  # one signature over the whole index binds every entry
    key = sig.get("key_id") if isinstance(sig, dict) else None
    # a sharded bundle keeps its entries in the shards: the caller falls back to the status
    for entry in (index.get("tools") or {}).values():
        if isinstance(entry, dict) and entry.get("source") == manifest:
            return Enforced(int(entry.get("version") or 0), str(entry.get("checksum")), key)
    return None


def enforced_from_status(obj: Mapping[str, Any]) -> Enforced | None:
    st = status(obj)
    if st.get("publishedVersion") is None:
        return None
    return Enforced(int(st["publishedVersion"]), str(st.get("publishedChecksum")), st.get("keyId"))


def bundle_index(configmap: Mapping[str, Any]) -> str:
    data = configmap.get("data")
    return str(data.get(INDEX_KEY, "")) if isinstance(data, Mapping) else ""


# ---- history --------------------------------------------------------------------------

@dataclass(frozen=True)
class VersionRow:
    version: int
    checksum: str
    author: str
    created: str
    revision: str
    approved_by: tuple[str, ...] = ()
    denied_by: tuple[str, ...] = ()
    signed_by: str | None = None
    enforced: bool = False
    current: bool = False

    def decided(self) -> str:
        if self.denied_by:
            return "denied by " + ", ".join(self.denied_by)
        return ", ".join(self.approved_by) or "-"

    def cells(self) -> list[object]:
        return [self.version, short(self.checksum), self.author or "-", self.decided(),
                self.signed_by or "-", "yes" if self.enforced else "no", self.created]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "checksum": self.checksum, "author": self.author or None,
                "approvedBy": list(self.approved_by), "deniedBy": list(self.denied_by),
                "signedBy": self.signed_by, "enforced": self.enforced, "current": self.current,
                "created": self.created, "revision": self.revision}


HISTORY_HEADERS = ("VERSION", "CHECKSUM", "AUTHOR", "APPROVED BY", "SIGNED BY", "ENFORCED", "CREATED")


def revisions_of(revisions: Iterable[Mapping[str, Any]], manifest: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The ControllerRevisions the ToolManifest owns, oldest version first."""
    uid = meta(manifest).get("uid")
    owned = [r for r in revisions
             if any(o.get("kind") == "ToolManifest" and o.get("uid") == uid
                    for o in meta(r).get("ownerReferences") or [])]
    return sorted(owned, key=lambda r: int(r.get("revision") or 0))


def history(manifest: Mapping[str, Any], revisions: Iterable[Mapping[str, Any]],
            approvals: Iterable[Mapping[str, Any]], enforced: Enforced | None) -> list[VersionRow]:
    name = str(meta(manifest).get("name"))
    by_checksum = decisions(approvals, name)
    current = status(manifest).get("checksum") if settled(manifest) else None
    approved_by = status(manifest).get("approvedBy")
    rows = []
    for r in revisions_of(revisions, manifest):
        digest = annotations_of(r).get(CHECKSUM_ANNOTATION, "")
        found = by_checksum.get(digest, [])
        approvers = tuple(dict.fromkeys(d.approver for d in found if d.verb == "approve"))
        if not approvers and isinstance(approved_by, Mapping) and approved_by.get("checksum") == digest \
                and not approved_by.get("approval"):
            approvers = (f"{approved_by.get('user')} (trusted applier)",)
        is_enforced = enforced is not None and enforced.checksum == digest
        rows.append(VersionRow(
            int(r.get("revision") or 0), digest, annotations_of(r).get(AUTHOR_ANNOTATION, ""),
            str(meta(r).get("creationTimestamp") or ""), str(meta(r).get("name")), approvers,
            tuple(dict.fromkeys(d.approver for d in found if d.verb == "deny")),
            enforced.key_id if is_enforced and enforced is not None else None, is_enforced,
            digest == current))
    return rows


def revision(manifest: Mapping[str, Any], revisions: Iterable[Mapping[str, Any]],
             version: int) -> Mapping[str, Any]:
    """The ControllerRevision of one version; UsageError names the versions that exist."""
    owned = revisions_of(revisions, manifest)
    for r in owned:
        if int(r.get("revision") or 0) == version:
            return r
    have = ", ".join(str(r.get("revision")) for r in owned) or "none yet"
    raise UsageError(f"tm/{meta(manifest).get('name')} has no version {version}; its versions: {have}")


def revision_data(r: Mapping[str, Any]) -> Mapping[str, Any]:
    return part(r, "data")


def diff_text(label_a: str, a: Mapping[str, Any], label_b: str, b: Mapping[str, Any]) -> str:
    """A unified diff of two manifests as YAML with sorted keys ("" when equal)."""
    def lines(data: Mapping[str, Any]) -> list[str]:
        text = yaml.safe_dump(dict(data), sort_keys=True, default_flow_style=False, allow_unicode=True,
                              width=100)
        return text.splitlines(keepends=True)
    return "".join(difflib.unified_diff(lines(a), lines(b), label_a, label_b))


# ---- state ----------------------------------------------------------------------------

@dataclass(frozen=True)
class State:
    state: str  # enforced | waits for approval | draft | denied | invalid | deletion blocked | ...
    waiting_for: str  # "-" when nothing is awaited


def _wanted(obj: Mapping[str, Any]) -> str:
    who = author(obj)
    return f"an approver other than {who}" if who else "an approver"


def state(obj: Mapping[str, Any], by_checksum: Mapping[str, Sequence[Decision]] | None = None) -> State:
    """Where one ToolManifest stands, from its conditions, and who or what it waits for."""
    if not settled(obj):
        return State("not reconciled", "the operator to read the latest spec")
    cond = conditions(obj)
    ready, valid, approved = (cond.get(t, {}) for t in ("Ready", "Valid", "Approved"))
    if ready.get("reason") == Reason.DELETION_BLOCKED:
        readers = [f"tm/{r.get('name')}" for r in status(obj).get("readers") or [] if isinstance(r, Mapping)]
        return State("deletion blocked", "its readers to go: " + (", ".join(readers) or "see Ready"))
    if valid.get("status") != "True":
        return State("invalid", f"fix: {valid.get('message') or 'see the Valid condition'}")
    if approved.get("reason") == Reason.DENIED:
        deniers = [d.approver for d in (by_checksum or {}).get(str(status(obj).get("checksum")), [])
                   if d.verb == "deny"]
        because = f" (denied by {deniers[0]})" if deniers else ""
        return State("denied", f"a new spec: a deny is final{because}")
    if approved.get("reason") == Reason.DRAFT:
        return State("draft", f"{_wanted(obj)}, to promote it")
    if approved.get("reason") == Reason.AWAITING:
        return State("waits for approval", _wanted(obj))
    if ready.get("status") == "True":
        return State("enforced", "-")
    if approved.get("status") == "True":
        return State("approved", "the operator to publish it")
    return State(str(ready.get("reason") or "unknown"), str(ready.get("message") or "-"))


NAMESPACE_HEADERS = ("NAME", "TOOL", "VERSION", "ENFORCED", "STATE", "WAITING FOR")


@dataclass(frozen=True)
class Summary:
    name: str
    tool: str
    version: int | None
    enforced: int | None
    state: State

    def cells(self, width: int = 100) -> list[object]:
        waiting = self.state.waiting_for
        if len(waiting) > width:
            waiting = waiting[:width - 1] + "…"
        return [self.name, self.tool, self.version, self.enforced, self.state.state, waiting]

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "tool": self.tool, "version": self.version, "enforced": self.enforced,
                "state": self.state.state, "waitingFor": None if self.state.waiting_for == "-"
                else self.state.waiting_for}


def summaries(manifests: Iterable[Mapping[str, Any]], approvals: Sequence[Mapping[str, Any]]) -> list[Summary]:
    out = []
    for obj in sorted(manifests, key=lambda o: str(meta(o).get("name"))):
        name = str(meta(obj).get("name"))
        spec = part(obj, "spec")
        st = status(obj)
        out.append(Summary(name, str(spec.get("tool") or "-"), st.get("version"), st.get("publishedVersion"),
                           state(obj, decisions(approvals, name))))
    return out


@dataclass
class Detail:
    """One ToolManifest in full, for `status tm/NAME`."""

    obj: Mapping[str, Any]
    approvals: Sequence[Mapping[str, Any]] = field(default_factory=list)

    def _parts(self) -> dict[str, Any]:
        obj, st = self.obj, status(self.obj)
        spec = part(obj, "spec")
        name = str(meta(obj).get("name"))
        enforced = enforced_from_status(obj)
        return {"name": name, "namespace": meta(obj).get("namespace"), "tool": spec.get("tool"),
                "effect": spec.get("effect"), "permission": spec.get("permission"),
                "version": st.get("version"), "checksum": st.get("checksum"),
                "lifecycle": st.get("lifecycle"), "lastChangedBy": author(obj),
                "enforced": None if enforced is None else {"version": enforced.version,
                                                          "checksum": enforced.checksum,
                                                          "keyId": enforced.key_id},
                "approvedBy": st.get("approvedBy"),
                "state": state(obj, decisions(self.approvals, name)),
                "readers": [dict(r) for r in st.get("readers") or [] if isinstance(r, Mapping)],
                "conditions": [dict(c) for c in conditions(obj).values()]}

    def to_json(self) -> dict[str, Any]:
        parts = self._parts()
        s: State = parts.pop("state")
        return {**parts, "state": s.state, "waitingFor": None if s.waiting_for == "-" else s.waiting_for}

    def text(self) -> str:
        p = self._parts()
        s: State = p["state"]
        version = f"{p['version']} ({short(p['checksum'])})" if p["version"] is not None else "- (invalid spec)"
        enforced = p["enforced"]
        by = p["approvedBy"]
        pairs: list[tuple[str, object]] = [
            ("ToolManifest", f"{p['name']} in namespace {p['namespace']}"),
            ("Tool", p["tool"]),
            ("Effect", f"{p['effect']} (permission {p['permission']})"),
            ("Version", version),
            ("Last changed by", p["lastChangedBy"]),
            ("Lifecycle", p["lifecycle"]),
            ("Enforced", None if enforced is None else
             f"version {enforced['version']} ({short(enforced['checksum'])})"
             + (f", signed by key {enforced['keyId']}" if enforced["keyId"] else ", unsigned")),
            ("Approved by", None if not isinstance(by, Mapping) else
             f"{by.get('user')}" + (f" (Approval {by['approval']})" if by.get("approval") else
                                    " (trusted applier)")),
            ("State", s.state),
            ("Waiting for", s.waiting_for),
            ("Readers", ", ".join(f"tm/{r.get('name')} ({r.get('path')})" for r in p["readers"]) or None),
        ]
        rows = [(c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in p["conditions"]]
        conds = table(("TYPE", "STATUS", "REASON", "MESSAGE"), rows) if rows else "(none yet)"
        return described(pairs) + "\nConditions:\n" + "\n".join(f"  {line}" for line in conds.splitlines())


# ---- rollback: plan inputs and --watch ------------------------------------------------

FINAL_REASONS = frozenset({"PlanFailed", "PlanTooLarge", "NoImage", "StepFailed", "Cancelled"})
# The operator could not plan or record the request on this ledger (docs/rollback.md):
# status.rollback never gets to the request's generation, so the condition alone says it.
PASS_FAILURES = frozenset({"StatusWriteFailed", "ReconcileFailed"})
PARTIAL = "PartiallyRolledBack"


def cluster_versions(manifests: Iterable[Mapping[str, Any]], revisions: Iterable[Mapping[str, Any]],
                     *, current: bool = False) -> Any:
    """The plan's manifests from what the cluster records: every ControllerRevision whose
    data matches its checksum, by checksum; today's set is the version each ToolManifest
    publishes (``status.publishedChecksum``), which is what the bundle enforces."""
    from ..ledger.plan import Versions
    from ..manifest.canonical import checksum
    from ..manifest.validate import validate_manifest

    by_checksum: dict[str, Any] = {}
    for r in revisions:
        claimed = annotations_of(r).get(CHECKSUM_ANNOTATION)
        model, issues = validate_manifest(revision_data(r))
        if model is not None and not issues and claimed and checksum(model) == claimed:
            by_checksum[claimed] = model
    tools = {}
    for obj in manifests:
        published = status(obj).get("publishedChecksum")
        if isinstance(published, str) and published in by_checksum:
            model = by_checksum[published]
            tools[model.tool] = model
    return Versions(by_checksum, tools, current)


def rollback_request(reason: str, since: str | None, entries: Sequence[str], at: str) -> dict[str, Any]:
    """The merge patch of ``spec.rollback`` (``requestedAt`` makes asking again a new request)."""
    return {"spec": {"rollback": {"requested": True, "reason": reason, "since": since,
                                  "entries": list(entries), "requestedAt": at}}}


def planned_line(rollback: Mapping[str, Any]) -> str:
    """The first line once the operator froze the plan: how many steps, who asked."""
    steps = [s for s in rollback.get("steps") or [] if isinstance(s, Mapping)]
    raw = rollback.get("requestedBy")
    by: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    who = (f"requested by {by['user']}" if by.get("user")
           else f"requester unknown: {by['problem']}" if by.get("problem") else "")
    if rollback.get("error"):
        return f"no plan: {rollback['error']}" + (f" ({who})" if who else "")
    n = len(steps)
    return (f"planned at {rollback.get('planned')}: {n} step{'' if n == 1 else 's'}, "
            f"{rollback.get('skipped') or 0} with nothing to undo" + (f"; {who}" if who else ""))


def stuck_line(obj: Mapping[str, Any], generation: int) -> str | None:
    """While a running step's pod cannot start (a missing Secret, an image, no node): what
    the operator found, from the RolledBack condition (reason StepStuck)."""
    rolled = conditions(obj).get("RolledBack", {})
    if rolled.get("reason") != "StepStuck" or int(rolled.get("observedGeneration") or 0) < generation:
        return None
    return f"stuck: {rolled.get('message')}"


def waiting_line(obj: Mapping[str, Any], generation: int) -> str | None:
    """While the operator waits for the run's calls in flight (the run fenced, nothing
    planned yet): what it waits for, from the RollbackPlanned condition."""
    planned = conditions(obj).get("RollbackPlanned", {})
    if planned.get("reason") != "WaitingForCalls" or \
            int(planned.get("observedGeneration") or 0) < generation:
        return None
    return f"waiting: {planned.get('message')}"


def step_lines(seen: dict[int, str], rollback: Mapping[str, Any]) -> list[str]:
    """A line for each step whose state changed since ``seen`` (updated in place), as
    `kubectl rollout status` prints progress."""
    steps = [s for s in rollback.get("steps") or [] if isinstance(s, Mapping)]
    lines = []
    for s in steps:
        index, state_ = int(s.get("index") or 0), str(s.get("state") or "")
        if seen.get(index) == state_:
            continue
        seen[index] = state_
        what = f"{s.get('entry')} {s.get('action')}" + (f" {s['undo_tool']}" if s.get("undo_tool") else "")
        detail = {"running": f"Job {s.get('job')}", "waiting": "needs an Approval of entry "
                  f"{s.get('entry')}", "pending": ""}.get(state_, s.get("first_mismatch") or s.get("message") or "")
        lines.append(f"step {index}/{len(steps)} {what}: {state_}" + (f": {detail}" if detail else ""))
    return lines


def rollback_done(obj: Mapping[str, Any], generation: int) -> tuple[bool, str] | None:
    """(succeeded, why) once the rollback of ``generation`` has ended, else None. A
    rollback of some entries whose run has other live effects ends (True, "PartiallyRolledBack: ...")."""
    conds = conditions(obj)
    rolled, degraded = conds.get("RolledBack", {}), conds.get("Degraded", {})
    if rolled.get("reason") in PASS_FAILURES and int(rolled.get("observedGeneration") or 0) >= generation:
        return False, f"{rolled.get('reason')}: {rolled.get('message')}"
    rb = status(obj).get("rollback")
    if not isinstance(rb, Mapping) or int(rb.get("generation") or 0) < generation:
        return None
    if rolled.get("observedGeneration") not in (None, generation) and not rb.get("finished"):
        return None
    if rolled.get("status") == "True":
        return True, str(rolled.get("message") or "rolled back")
    if rolled.get("reason") == PARTIAL and rb.get("finished"):
        return True, f"{PARTIAL}: {rolled.get('message')}"
    if degraded.get("status") == "True" and rb.get("finished"):
        return False, f"Degraded: {degraded.get('message')}"
    if rolled.get("status") == "False" and rolled.get("reason") in FINAL_REASONS and rb.get("finished"):
        return False, f"{rolled.get('reason')}: {rolled.get('message')}"
    return None


def ended_line(target: str, ok: bool, why: str) -> str:
    """The watch's last line once the rollback ended."""
    if ok and why.startswith(f"{PARTIAL}: "):
        return f"{target}: partly rolled back: {why[len(PARTIAL) + 2:]}"
    return f"{target}: {'rolled back' if ok else 'not rolled back'}: {why}"


def ns_flag(namespace: Any) -> str:
    """`` -n NAMESPACE`` for a command a message suggests, so it works as written."""
    return f" -n {namespace}" if isinstance(namespace, str) and namespace else ""


def watch_timeout(obj: Mapping[str, Any], target: str, generation: int, timeout: float) -> str:
    """What --watch says when it gives up: where the rollback stands, or what the ledger says
    went wrong; "is the operator running?" only when nothing shows the operator saw the request."""
    name = target.split("/", 1)[-1]
    rb = status(obj).get("rollback")
    conds = conditions(obj)
    rolled, degraded = conds.get("RolledBack", {}), conds.get("Degraded", {})
    head = f"error: timed out after {timeout:g}s"
    ns = ns_flag(meta(obj).get("namespace"))
    events = f"kubectl get events{ns} --field-selector involvedObject.name={name}"
    if degraded.get("status") == "True":
        return f"{head}: {target} is Degraded ({degraded.get('reason')}): {degraded.get('message')}"
    if isinstance(rb, Mapping) and int(rb.get("generation") or 0) >= generation:
        state = f" ({rolled.get('reason')}: {rolled.get('message')})" if rolled else ""
        return f"{head}; the rollback goes on{state}: follow it with `kubectl get {target}{ns} -w` or {events}"
    return (f"{head}: the operator has not planned the request (generation {generation}) and the ledger "
            f"shows no failure: is the operator running and leading? See {events} and the operator's log")
