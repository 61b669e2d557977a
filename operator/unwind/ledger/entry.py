"""One ledger entry: the record of one call, written before the upstream sees it.

An entry's life: ``pending`` is stored first (write-ahead), then ``succeeded``, ``failed``
or ``uncertain`` (sent, answer lost). A refusal is recorded as ``refused`` with its code;
a call that needs a human waits as ``awaiting_approval`` (then ``denied``, or it runs);
rollback later adds ``undoing``, ``undone`` and ``undo_failed``, or ``moot`` (its object was
removed by the undo of an older entry on it: nothing left to undo); a person may
``settle`` an entry by hand (``settled``, with who, when and why). Which writer may make
which change is ``ledger/lifecycle.py``'s table, which every store applies.

The entry keeps only what an undo, a read-back or a lookup needs (the ``handle``); the
arguments are never stored whole, only their digest, so a repeated call (an approved one,
or a retry after a failure) can be recognised as the same call.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

State = Literal["refused", "awaiting_approval", "denied", "pending", "succeeded", "failed",
                "uncertain", "undoing", "undone", "undo_failed", "moot", "settled"]
STATES: tuple[State, ...] = ("refused", "awaiting_approval", "denied", "pending", "succeeded",
                             "failed", "uncertain", "undoing", "undone", "undo_failed", "moot",
                             "settled")
# Which states hold the rendered key, and which Idempotency-Keys may be used again, is the
# lifecycle's to say (ledger/lifecycle.py: HOLDING, REUSABLE).
REDACTED = "[redacted]"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EntryError(_Model):
    code: str = Field(description="The error code the caller got, e.g. duplicate or upstream_timeout.")
    message: str = Field(description="What happened; audit.redaction values are masked.")


class Handle(_Model):
    """Only the values an undo, its read-back, a deadline or a lookup names."""

    args: dict[str, Any] = Field(default_factory=dict, description="Kept call arguments (paths as in the call).")
    result: Any = Field(default_factory=dict, description="Kept parts of the upstream's answer.")
    # Left out when None: the API server drops a null in open data, so a status written with
    # it would read back different from what was sent.
    before: Any = Field(None, exclude_if=lambda v: v is None,
                        description="Kept parts of the state the manifest's capture read before "
                                    "the call ($before paths the undo names); absent without a capture.")
    after: Any = Field(None, exclude_if=lambda v: v is None,
                       description="The verification's read made right after the call "
                                   "(verification.after_call), kept at its expect paths: what the "
                                   "divergence check compares the state before the undo with.")


class Staged(_Model):
    draft_tool: str = Field(description="The tool that made the draft.")
    handle: dict[str, Any] = Field(default_factory=dict, description="Identifies the draft (draft.handle).")
    promote: str = Field(description="The tool that turns the draft into the real effect.")
    discard: str | None = Field(None, description="The tool that throws the draft away.")


class ApprovalDecision(_Model):
    name: str = Field(description="The decision's name (an Approval object in a cluster).")
    user: str
    groups: list[str] = Field(default_factory=list)
    decision: Literal["approve", "deny"]
    reason: str = ""
    created: str = Field(description="When the decision was made (RFC 3339).")
    arguments_sha256: str | None = Field(
        None, description="The arguments it decided on (the entry's arguments_sha256 then): it "
                          "counts only while the entry holds these arguments.")


class ApprovalRulesRecord(_Model):
    roles: list[str] = Field(default_factory=list)
    quorum: int = 1
    timeout_ms: int | None = None
    on_timeout: Literal["deny", "escalate"] = "deny"
    escalate_to: list[str] = Field(default_factory=list)


class EntryApproval(_Model):
    """The rules frozen when the call was requested, the decisions so far and their tally."""

    rules: ApprovalRulesRecord
    identities: Literal["kubernetes", "self-declared"] = Field(
        description="kubernetes: the admission webhook stamped each approver; self-declared: "
                    "local mode, where `unwind approve --ledger` takes --by at its word.")
    decisions: list[ApprovalDecision] = Field(default_factory=list)
    state: Literal["awaiting_approval", "approved", "denied"] = "awaiting_approval"
    message: str = ""


class Settlement(_Model):
    """A person resolved the entry by hand (``unwind settle``): who, when, why, from what."""

    by: str = Field(description="Who settled it: the API server's username in a cluster (the "
                                "Approval's stamp), --by locally.")
    groups: list[str] = Field(default_factory=list, description="Their groups at the time.")
    identities: Literal["kubernetes", "self-declared"] = Field(
        description="kubernetes: the admission webhook stamped the person; self-declared: a "
                    "local ledger, where --by is taken at its word.")
    reason: str = Field(description="What was done by hand, in the person's words.")
    at: str = Field(description="When it was recorded (RFC 3339).")
    was: str = Field(description="The entry's state before it was settled.")
    approval: str | None = Field(None, description="The Approval (decision: settle) that recorded it.")


class Times(_Model):
    requested: str = Field(description="When the call arrived (RFC 3339).")
    started: str | None = Field(None, description="When the upstream was called.")
    finished: str | None = Field(None, description="When the answer (or its absence) was recorded.")


class Attempt(_Model):
    """An earlier attempt under the same Idempotency-Key (after failed or refused)."""

    state: State
    error: EntryError | None = None
    finished: str | None = None
    arguments_sha256: str | None = Field(None, description="The arguments of that attempt.")
    approval: EntryApproval | None = Field(
        None, description="That attempt's approval: a reused id starts a fresh one.")


class Entry(_Model):
    id: str = Field(description="The caller's Idempotency-Key (or a generated ULID).")
    seq: int = Field(0, description="Order in the run, from 1.")
    tool: str
    version: int | None = Field(None, description="The manifest version enforced.")
    checksum: str | None = Field(None, description="The manifest checksum enforced.")
    effect: str | None = Field(None, description="The tool's effect class.")
    key: str | None = Field(None, description="The rendered idempotency key, or null.")
    scope: Literal["run", "actor", "global"] | None = Field(None, description="Where the key must be unique.")
    actor: str
    state: State
    arguments_sha256: str | None = Field(None, description="Digest of the canonical arguments: a repeat must match.")
    handle: Handle | None = None
    report: dict[str, Any] | None = Field(None, description="The X-Unwind-Effect report the caller got.")
    error: EntryError | None = None
    staged: Staged | None = None
    approval: EntryApproval | None = None
    warnings: list[str] = Field(default_factory=list)
    undo: dict[str, Any] | None = Field(None, description="The undo's detail (rollback).")
    attempts: list[Attempt] = Field(default_factory=list, description="Earlier attempts under this id.")
    settled: Settlement | None = Field(None, description="Set when a person settled the entry by hand.")
    key_sent: str | None = Field(None, description="The key as sent upstream, when it is not the "
                                                   "rendered key (scope run with a carrier: the "
                                                   "run is part of it); lookups send this one.")
    times: Times
    traceparent: str | None = Field(
        None, pattern=r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$",
        description="The W3C traceparent of the call that wrote the entry, when the gateway "
                    "traces: the undo Jobs of its rollback continue that trace.")
    deadline: str | None = Field(
        None, description="When the call can no longer be under way (RFC 3339): written ahead "
                          "with the pending entry, from the call's timeout and retries. Until "
                          "then its key's lock stands, a lookup leaves it alone, and a rollback "
                          "of its run waits for it.")

    @property
    def holds_key(self) -> bool:
        from .lifecycle import HOLDING  # the lifecycle imports this module
        return self.key is not None and self.state in HOLDING

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


def now() -> datetime:
    return datetime.now(UTC)


def stamp(moment: datetime | None = None) -> str:
    """RFC 3339 in UTC with milliseconds (entries of one second must still sort)."""
    moment = moment or now()
    if moment.tzinfo is not UTC:
        moment = moment.astimezone(UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_stamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))
