"""The approval tally: is a call that needs a human approved, denied, or still waiting?

A call whose manifest (or policy) requires approval becomes a ledger entry awaiting
approval, carrying a frozen copy of its rules; people answer with Approval objects; the
operator gathers them and calls ``tally``. The tally is a pure function of the request,
the decisions and the clock. The rules, and why each is the one chosen:

- **Merging** rules from several sources (manifest, policy): any listed group may approve
  (union), the largest quorum and the shortest timeout win, escalate_to is the union. A
  source listing no groups adds no restriction: ``always`` means "a human", and must not
  turn the manifest's ``finance`` into "anyone". on_timeout is ``escalate`` only when every
  source that sets a timeout says so; one source asking for a hard stop is enough to deny.
  A source without a timeout never times out, so its on_timeout (usually the default) does
  not vote.
- **Who counts**: roles are Kubernetes groups; an approver counts when holding one listed
  group (anyone, when none is listed). Quorum counts distinct usernames. The caller of the
  call never decides on its own entry (four-eyes), neither approving nor denying.
- **Order**: decisions count in creation order; at the same instant (Kubernetes timestamps
  have one-second resolution) a deny goes first, then by name. The first terminal outcome
  wins: reaching the quorum approves, and a later deny changes nothing; an eligible deny
  before the quorum denies, and nothing undoes that.
- Only decisions made at or after the request count: nobody approves a call they have not
  seen, and an entry id is predictable enough to be pre-approved otherwise.
- **Arguments**: a decision is bound to the arguments it was made on (their
  ``arguments_sha256``); it counts only for a request with exactly those arguments. An
  Idempotency-Key reused after a failed call with other arguments is a new call, and no
  decision made on the old one approves (or denies) it.
- **Timeout**: the deadline is requested_at + timeout; a decision made at the deadline is
  late. At the deadline without a quorum, ``deny`` denies; ``escalate`` closes the listed
  groups' window and the escalate_to groups decide from then on. Approvals made before the
  deadline keep counting and the quorum stays the same: escalation changes who decides,
  never how many, so waiting out the clock never lowers the bar. There is no second
  timeout: escalation exists so a call is not refused only because nobody looked, and no
  field says what a second timeout should do.
- **Clock**: the deadline has passed when ``now`` reached it, or when any decision was made
  at or after it: the API server stamps creation times and its clock may run a little ahead
  of the operator's, and a tally re-run later must never reach a different outcome.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from ..manifest.model import Approval, ToolManifest

OnTimeout = Literal["deny", "escalate"]
State = Literal["awaiting_approval", "approved", "denied"]
AWAITING: State = "awaiting_approval"
ANONYMOUS = "system:anonymous"
_RULE_FIELDS = ("roles", "quorum", "timeout_ms", "on_timeout", "escalate_to")
_REASON_MAX = 200


@dataclass(frozen=True)
class ApprovalRules:
    """Who approves one call, how many, and what happens when nobody does in time."""

    roles: tuple[str, ...] = ()
    quorum: int = 1
    timeout_ms: int | None = None
    on_timeout: OnTimeout = "deny"
    escalate_to: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        problems = _rule_problems(self)
        if problems:
            raise ValueError("approval rules: " + "; ".join(problems))

    @classmethod
    def from_manifest(cls, model: ToolManifest | Approval) -> ApprovalRules | None:
        """The rules a manifest (or its ``approval``) sets; None when it needs no approval."""
        a = model.approval if isinstance(model, ToolManifest) else model
        if not a.required:
            return None
        return cls(tuple(a.roles), a.quorum, a.timeout, a.on_timeout, tuple(a.escalate_to))

    @classmethod
    def from_json(cls, data: Any) -> ApprovalRules:
        """Read the copy stored in a ledger entry back; a wrong field is named."""
        if not isinstance(data, Mapping):
            raise ValueError(f"approval rules must be an object, not {type(data).__name__}")
        unknown = sorted(set(data) - set(_RULE_FIELDS))
        if unknown:
            raise ValueError(f"approval rules: unknown field {', '.join(map(str, unknown))}; "
                             f"the fields are {', '.join(_RULE_FIELDS)}")
        groups: dict[str, tuple[Any, ...]] = {}
        for key in ("roles", "escalate_to"):
            value = data.get(key, [])
            if not isinstance(value, list | tuple):
                raise ValueError(f"approval rules: {key} must be a list of group names")
            groups[key] = tuple(value)
        return cls(groups["roles"], data.get("quorum", 1), data.get("timeout_ms"),
                   data.get("on_timeout", "deny"), groups["escalate_to"])

    def to_json(self) -> dict[str, Any]:
        return {"roles": list(self.roles), "quorum": self.quorum, "timeout_ms": self.timeout_ms,
                "on_timeout": self.on_timeout, "escalate_to": list(self.escalate_to)}


def _rule_problems(r: ApprovalRules) -> list[str]:
    problems = []
    for key, groups in (("roles", r.roles), ("escalate_to", r.escalate_to)):
        if not isinstance(groups, tuple) or not all(isinstance(g, str) and g for g in groups):
            problems.append(f"{key} must be group names (non-empty strings)")
    if isinstance(r.quorum, bool) or not isinstance(r.quorum, int) or r.quorum < 1:
        problems.append(f"quorum must be a whole number of at least 1 (got {r.quorum!r})")
    if r.timeout_ms is not None and (isinstance(r.timeout_ms, bool)
                                     or not isinstance(r.timeout_ms, int) or r.timeout_ms < 0):
        problems.append(f"timeout_ms must be milliseconds, 0 or more (got {r.timeout_ms!r})")
    if r.on_timeout not in ("deny", "escalate"):
        problems.append(f"on_timeout must be deny or escalate (got {r.on_timeout!r})")
    elif r.on_timeout == "escalate" and not r.escalate_to:
        problems.append("on_timeout escalate needs escalate_to: list the groups to ask")
    return problems


def merge(*rules: ApprovalRules) -> ApprovalRules:
    """One call's rules from several sources (see the module docstring for why)."""
    if not rules:
        raise ValueError("merge needs at least one set of approval rules")
    timed = [r for r in rules if r.timeout_ms is not None]
    escalate = bool(timed) and all(r.on_timeout == "escalate" for r in timed)
    return ApprovalRules(
        roles=_union(r.roles for r in rules),
        quorum=max(r.quorum for r in rules),
        timeout_ms=min((r.timeout_ms for r in timed if r.timeout_ms is not None), default=None),
        on_timeout="escalate" if escalate else "deny",
        escalate_to=_union(r.escalate_to for r in rules),
    )


def _union(groups: Iterable[tuple[str, ...]]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(g for gs in groups for g in gs))


@dataclass(frozen=True)
class ApprovalRequest:
    """The entry waiting for approval: where it is, who made the call, when, under which rules."""

    ledger: str
    entry: str
    actor: str
    requested_at: datetime
    rules: ApprovalRules
    arguments_sha256: str | None = None  # the call's arguments; None: not bound (tests)

    def __post_init__(self) -> None:
        _require_aware(self.requested_at, "requested_at")

    @property
    def deadline(self) -> datetime | None:
        if self.rules.timeout_ms is None:
            return None
        return self.requested_at + timedelta(milliseconds=self.rules.timeout_ms)


@dataclass(frozen=True)
class Decision:
    """One Approval object as the tally sees it; user and groups are the webhook's stamp."""

    name: str
    user: str
    groups: tuple[str, ...]
    decision: Literal["approve", "deny"]
    reason: str
    created: datetime
    ledger: str | None  # spec.target.effectLedger; None when it targets a manifest
    entry: str | None
    arguments_sha256: str | None = None  # the arguments decided on


@dataclass(frozen=True)
class Tally:
    state: State
    approvers: tuple[str, ...]  # usernames that counted, in the order they did
    ignored: tuple[tuple[str, str], ...]  # (Approval name, why), sorted by name
    escalated_at: datetime | None
    message: str  # one sentence for kubectl describe and the gateway's answer
    decided_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "approvers": list(self.approvers),
            "ignored": [{"name": name, "why": why} for name, why in self.ignored],
            "escalatedAt": _stamp(self.escalated_at) if self.escalated_at else None,
            "message": self.message,
            "decidedAt": _stamp(self.decided_at) if self.decided_at else None,
        }


def tally(request: ApprovalRequest, decisions: Iterable[Decision], now: datetime,
          *, four_eyes: bool = True) -> Tally:
    """Where the entry stands at ``now`` given every decision made so far."""
    _require_aware(now, "now")
    count = _Count(request, four_eyes)
    usable: list[Decision] = []
    for d in decisions:
        why = _unusable(d, request)
        if why:
            count.ignored.append((d.name, why))
        else:
            usable.append(d)
    deadline = request.deadline
    for d in sorted(usable, key=lambda d: (d.created, d.decision != "deny", d.name)):
        if deadline is not None and d.created >= deadline:
            count.time_out(deadline)  # made at or after the deadline: the clock reached it
        count.decide(d)
    if deadline is not None and deadline <= now:
        count.time_out(deadline)
    return count.result()


def next_deadline(request: ApprovalRequest, result: Tally) -> datetime | None:
    """When ``result`` will change by itself (the timeout), so a caller can re-tally then."""
    if result.state != AWAITING or result.escalated_at is not None:
        return None
    return request.deadline


def _unusable(d: Decision, request: ApprovalRequest) -> str | None:
    """Why a decision cannot count at all, whatever the rules and the order."""
    if d.ledger is None or d.entry is None:
        return "does not target a ledger entry"
    if (d.ledger, d.entry) != (request.ledger, request.entry):
        return (f"targets entry {d.entry} of ledger {d.ledger}, "
                f"not {request.entry} of {request.ledger}")
    if request.arguments_sha256 is not None and d.arguments_sha256 != request.arguments_sha256:
        return (f"was made on other arguments ({_short_sha(d.arguments_sha256)}), not this "
                f"call's ({_short_sha(request.arguments_sha256)}): decide on the call again")
    if not d.user or not d.user.strip():
        return "has no approver username: the admission webhook did not stamp one"
    if d.user == ANONYMOUS:
        return "was made anonymously"
    if d.decision not in ("approve", "deny"):
        return f"decision {d.decision!r} is neither approve nor deny"
    if d.created.utcoffset() is None:
        return "its creation time has no time zone"
    # Kubernetes stamps objects to the second: a decision in the same second as the request
    # cannot be told to be earlier, so only a whole second before counts as before.
    if d.created < request.requested_at.replace(microsecond=0):
        return (f"was made at {_stamp(d.created)}, before the call was requested at "
                f"{_stamp(request.requested_at)}")
    return None


@dataclass
class _Count:
    """The running tally while decisions are replayed in order."""

    request: ApprovalRequest
    four_eyes: bool
    counted: dict[str, str] = field(default_factory=dict)  # user -> the Approval that counted
    ignored: list[tuple[str, str]] = field(default_factory=list)
    state: State = AWAITING
    decided_at: datetime | None = None
    escalated_at: datetime | None = None
    denial: Decision | None = None

    @property
    def rules(self) -> ApprovalRules:
        return self.request.rules

    @property
    def groups(self) -> tuple[str, ...]:
        return self.rules.escalate_to if self.escalated_at else self.rules.roles

    def time_out(self, deadline: datetime) -> None:
        if self.state != AWAITING or self.escalated_at is not None:
            return  # decided before the deadline, or already escalated
        if self.rules.on_timeout == "deny":
            self.state, self.decided_at = "denied", deadline
        else:
            self.escalated_at = deadline

    def decide(self, d: Decision) -> None:
        why = self._why_not(d)
        if why:
            self.ignored.append((d.name, why))
        elif d.decision == "deny":
            self.state, self.decided_at, self.denial = "denied", d.created, d
        else:
            self.counted[d.user] = d.name
            if len(self.counted) >= self.rules.quorum:
                self.state, self.decided_at = "approved", d.created

    def _why_not(self, d: Decision) -> str | None:
        if self.state != AWAITING:
            return f"was made after the entry was {self.state} at {_stamp(self.decided_at)}"
        if self.four_eyes and d.user == self.request.actor:
            return f"{d.user} made the call, and nobody decides on their own call (four-eyes)"
        groups = self.groups
        if groups and not set(d.groups) & set(groups):
            since = (f", who decide since the escalation at {_stamp(self.escalated_at)}"
                     if self.escalated_at else "")
            return f"{d.user} holds none of groups {', '.join(groups)}{since}"
        if d.decision == "approve" and d.user in self.counted:
            return f"{d.user} already approved ({self.counted[d.user]})"
        return None

    def result(self) -> Tally:
        return Tally(self.state, tuple(self.counted), tuple(sorted(self.ignored)),
                     self.escalated_at, self._message(), self.decided_at)

    def _message(self) -> str:
        q, n = self.rules.quorum, len(self.counted)
        who = _who(self.rules.roles, self.request.actor if self.four_eyes else None)
        if self.state == "approved":
            after = (f", after escalation to groups {', '.join(self.rules.escalate_to)} at "
                     f"{_stamp(self.escalated_at)}" if self.escalated_at else f" {who}")
            return f"approved by {', '.join(self.counted)} ({n} of {q}{after})"
        if self.denial is not None:
            reason = _short(self.denial.reason)
            return (f"denied by {self.denial.user} at {_stamp(self.denial.created)}"
                    + (f": {reason}" if reason else ""))
        if self.state == "denied":
            return (f"timed out after {_duration(self.rules.timeout_ms or 0)} without "
                    f"{_plural(q, 'approval')} ({n} of {q} {who})")
        waiting = f"{n} of {q} approvals"
        if self.escalated_at:
            return (f"escalated to groups {', '.join(self.rules.escalate_to)} at "
                    f"{_stamp(self.escalated_at)}: {waiting}; waiting for {q - n} more, "
                    "with no further timeout")
        text = f"{waiting} {who}; waiting for {q - n} more"
        deadline = self.request.deadline
        if deadline is None:
            return text
        then = ("the call is denied" if self.rules.on_timeout == "deny"
                else f"groups {', '.join(self.rules.escalate_to)} decide")
        return f"{text} until {_stamp(deadline)}, then {then}"


def _who(roles: Sequence[str], actor: str | None) -> str:
    if roles:
        return f"from groups {', '.join(roles)}"
    return f"from anyone but {actor}" if actor else "from anyone"


def _require_aware(moment: datetime, name: str) -> None:
    if not isinstance(moment, datetime) or moment.utcoffset() is None:
        raise ValueError(f"{name} must be a datetime with a time zone (got {moment!r})")


def _stamp(moment: datetime | None) -> str:
    """RFC 3339 in UTC, as Kubernetes writes times; milliseconds only when there are some."""
    if moment is None:
        return "-"
    spec = "milliseconds" if moment.microsecond else "seconds"
    return moment.astimezone(UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def _duration(ms: int) -> str:
    if ms % 1000:
        return f"{ms}ms"
    seconds, parts = ms // 1000, []
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"


def _short_sha(digest: str | None) -> str:
    return "none named" if not digest else digest.removeprefix("sha256:")[:12]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _short(reason: str) -> str:
    text = " ".join((reason or "").split())
    return text if len(text) <= _REASON_MAX else text[: _REASON_MAX - 1] + "…"
