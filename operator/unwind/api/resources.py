"""The three Unwind resources: ToolManifest, EffectLedger and Approval.

The CRDs in ``crds/`` are generated from these models (``unwind crds``). ToolManifest's
spec is exactly the tool manifest model; its status is what the operator reports. The
EffectLedger holds one run's entries in its status (ledger.entry.Entry); a ledger file in
local mode holds exactly the object the API server would.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..ledger.entry import Entry
from ..ledger.fence import Fence
from ..manifest.model import ToolManifest
from .conditions import Condition


class _Status(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LintFinding(_Status):
    code: str = Field(description="Lint code, e.g. L011.")
    level: Literal["error", "warning", "info"]
    message: str


class LintSummary(_Status):
    errors: int = 0
    warnings: int = 0
    notes: int = 0
    findings: list[LintFinding] = Field(default_factory=list, description="At most 20 findings.")


class ReaderRef(_Status):
    name: str = Field(description="A ToolManifest that names this tool.")
    path: str = Field(description="The field that names it, e.g. compensation.tool.")


class ApprovedBy(_Status):
    user: str = Field(description="Username, as the API server authenticated it (service accounts as system:serviceaccount:NS:NAME).")
    groups: list[str] = Field(default_factory=list, description="The user's groups at the time.")
    approval: str | None = Field(None, description="The Approval object that approved it; absent when a trusted applier published it.")
    checksum: str = Field(description="The version (by checksum) this approval is for.")


class ToolManifestStatus(_Status):
    """What the operator made of the manifest."""

    observedGeneration: int | None = Field(None, description="The metadata.generation last reconciled.")
    version: int | None = Field(None, description="Registry version of the current spec (one per distinct checksum).")
    checksum: str | None = Field(None, description="sha256 of the canonical normalized spec.")
    lifecycle: Literal["draft", "awaiting-approval", "denied", "approved", "deprecated"] | None = Field(None, description="The current version's lifecycle: approved or deprecated once approved (Ready says whether it is enforced), else draft (spec.lifecycle: draft), awaiting-approval (an approver must approve it: see Approved) or denied (final for this version).")
    keyId: str | None = Field(None, description="Id of the key that signed the published version.")
    publishedVersion: int | None = Field(None, description="Version currently in the namespace bundle; may lag an invalid edit.")
    publishedChecksum: str | None = Field(None, description="Checksum of the version in the bundle.")
    lint: LintSummary | None = None
    readers: list[ReaderRef] = Field(default_factory=list, description="Live manifests that name this tool; while any exists, deletion waits (finalizer unwind.dev/readers).")
    approvedBy: ApprovedBy | None = Field(None, description="Who approved the enforced version: an Approval's approver, or the trusted applier.")
    conditions: list[Condition] = Field(default_factory=list, description="Valid, Approved, Signed, Published, Ready.")


class LedgerRollback(_Status):
    """A request to undo this run's effects (filled in by whoever asks; see the rollback docs)."""

    requested: bool = Field(False, description="True asks for the run's effects to be undone.")
    reason: str | None = Field(None, max_length=1024, description="Why, for the record.")
    since: str | None = Field(None, description="Undo only entries requested at or after this time (RFC 3339).")
    entries: list[str] = Field(default_factory=list, description="Undo only these entry ids (empty: all).")
    requestedAt: str | None = Field(None, description="When it was asked for (RFC 3339); `kubectl unwind rollback` sets it, so asking again is a new request.")


RollbackStepState = Literal["pending", "waiting", "running", "succeeded", "failed", "denied",
                            "left", "skipped", "cancelled", "moot", "settled"]


class RollbackStep(_Status):
    """One frozen step of a rollback: the plan step (the fields of `unwind plan --json`) and
    how its run went. Snake case, as the plan's JSON and the entries."""

    index: int = Field(description="1-based position in the plan; the Job's name carries it.")
    entry: str
    tool: str
    action: Literal["inverse", "compensate", "discard", "not_undoable", "unrecoverable", "lookup",
                    "skip", "moot"]
    undo_tool: str | None = None
    arguments: dict[str, Any] | None = Field(None, description="The undo (or lookup) call's arguments, resolved when the plan was frozen.")
    residue: list[str] = Field(default_factory=list)
    requires_approval: bool = False
    reason: str | None = Field(None, description="Why this action (the plan's reason).")
    object: str | None = Field(None, description="The object the entry touched (the plan's object key): steps on one object run one at a time, newest first.")
    headers: dict[str, Any] | None = Field(None, description="The undo call's headers resolved from the ledger (compensation.headers).")
    read_before: dict[str, Any] | None = Field(None, description="The read right before the undo (compensation.current): tool, arguments, binds.")
    state: RollbackStepState = Field(description="pending, waiting (for an Approval), running (its Job exists), succeeded, failed, denied, left (not undoable or unrecoverable: reported, not run), skipped (the entry changed meanwhile), cancelled, moot (an older entry's undo removed its object: nothing called), settled (a person settled its entry by hand).")
    job: str | None = Field(None, description="The Job running the step.")
    idempotency_key: str | None = Field(None, description="The step's stable key (undo steps).")
    attempts: int = Field(0, description="Jobs started for this step.")
    outcome: str | None = Field(None, description="The step runner's outcome: undone, undo_failed, found, not_found, lookup_failed, ...")
    message: str | None = Field(None, description="What happened, in a sentence.")
    first_mismatch: str | None = Field(None, description="A failed read-back's first mismatch.")
    approved_by: dict[str, Any] | None = Field(None, description="The Approval that let a requires_approval step run: user, groups, approval.")
    started: str | None = None
    finished: str | None = None


class Requester(_Status):
    """Who asked for a rollback, from the admission webhook's stamp on the ledger."""

    user: str | None = Field(None, description="Username as the API server authenticated it; null when no stamp verifies (see problem).")
    groups: list[str] = Field(default_factory=list, description="The user's groups at the time.")
    problem: str | None = Field(None, description="Why the requester is unknown: no stamp (the webhooks were not installed) or one that does not verify.")


class RollbackStatus(_Status):
    """The rollback the operator runs: the request as it was frozen, and its steps."""

    request: LedgerRollback = Field(description="spec.rollback when the plan was frozen.")
    requestedBy: Requester | None = Field(None, description="Who asked (annotation unwind.dev/rollback-by, verified).")
    generation: int = Field(description="The ledger's metadata.generation of that request.")
    planned: str = Field(description="When the plan was frozen (RFC 3339); deadlines are read as of then.")
    replanned: str | None = Field(None, description="When entries found by their lookups were planned again.")
    finished: str | None = Field(None, description="When the last step ended.")
    error: str | None = Field(None, description="Why no plan could be made.")
    reason: str | None = Field(None, description="With error: PlanFailed, PlanTooLarge or NoImage.")
    skipped: int = Field(0, description="Selected entries with nothing to undo (skip steps, not listed).")
    steps: list[RollbackStep] = Field(default_factory=list, description="In execution order.")


class RollbackRecordStep(_Status):
    """One step of a past rollback request, as it ended (the audit trail keeps this much)."""

    index: int
    entry: str
    action: str
    undo_tool: str | None = None
    state: str
    outcome: str | None = None


class RollbackRecord(_Status):
    """One rollback request of the run, kept after the next one replaces status.rollback:
    who asked, when, why, what was planned and how it ended (docs/rollback.md, audit trail)."""

    generation: int = Field(description="The ledger generation of the request.")
    request: LedgerRollback = Field(description="spec.rollback as asked for.")
    requestedBy: Requester | None = Field(None, description="Who asked, as verified.")
    seen: str = Field(description="When the operator first saw the request (RFC 3339).")
    planned: str | None = Field(None, description="When its plan was frozen (absent: never planned).")
    finished: str | None = None
    result: str | None = Field(None, description="How it ended: the RolledBack condition's reason then (RolledBack, PartiallyRolledBack, StepFailed, Cancelled, PlanFailed, ...).")
    message: str | None = None
    steps: list[RollbackRecordStep] = Field(default_factory=list, description="Its steps as they ended (at most 200; more are counted in moreSteps).")
    moreSteps: int = Field(0, description="Steps of the request not kept here (past 200).")


class LedgerSpec(_Status):
    """One agent run's ledger page. The entries live in the status, written by the gateway."""

    run: str = Field(description="The run this ledger records (the X-Unwind-Run header).")
    page: int = Field(1, ge=1, description="1 for the run's first page; a continuation page counts on.")
    owner: str | None = Field(None, description="The actor whose gateway created the run; only its gateway writes entries here. Set at creation, never changed (absent on ledgers older than it: then the actor of the first entry).")
    rollback: LedgerRollback | None = Field(None, description="A rollback request for the run.")


class LedgerStatus(_Status):
    """The entries, oldest first. A page that grows past about 1 MiB continues in the page
    named by ``next`` (``<run>.p<N>``), long before the API server's object size limit."""

    entries: list[Entry] = Field(default_factory=list, description="Ledger entries of this page, by seq.")
    next: str | None = Field(None, description="The name of the continuation page, when there is one.")
    entryCount: int = Field(0, description="Entries on this page (a printer column).")
    lastState: str | None = Field(None, description="The state of the latest entry (a printer column).")
    live: int | None = Field(None, description="On a run's first page: entries of the run whose effects may still stand "
                                               "(succeeded, uncertain or pending calls of tools that are not read-only "
                                               "or idempotent, and undos not done); the operator counts them at each "
                                               "rollback pass and at least every --lookup-interval (a printer column).")
    observedGeneration: int | None = None
    conditions: list[Condition] = Field(default_factory=list, description="On a run's first page: RollbackPlanned, RolledBack, Degraded, RetentionExpired (reasons: docs/rollback.md).")
    rollback: RollbackStatus | None = Field(None, description="On a run's first page: the rollback the operator runs (docs/rollback.md).")
    rollbacks: list[RollbackRecord] = Field(default_factory=list, description="On a run's first page: every rollback request of the run, oldest first (the audit trail: at most 20 requests and 64 KiB; older ones go first, counted in rollbacksDropped).")
    rollbacksDropped: int = Field(0, description="Rollback requests dropped from rollbacks to keep it within its bound (export the evidence to keep them).")
    fence: Fence | None = Field(None, description="A rollback closed the run to new calls (on every page, written before the rollback plans; docs/rollback.md).")


class ApprovalTarget(_Status):
    """Exactly one of: a ToolManifest version (toolManifest + checksum) or a ledger entry
    (effectLedger + entry)."""

    toolManifest: str | None = Field(None, description="Name of a ToolManifest in this namespace.")
    checksum: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$", description="The exact manifest version, by checksum (its status.checksum).")
    effectLedger: str | None = Field(None, description="Name of an EffectLedger in this namespace.")
    entry: str | None = Field(None, min_length=1, description="The ledger entry id.")
    argumentsSha256: str | None = Field(None, pattern=r"^sha256:[0-9a-f]{64}$", description="The entry's arguments_sha256 this decision is for (`kubectl unwind approve` fills it in); without it, the arguments the entry holds when the operator first records the decision. A decision counts only while the entry holds these arguments.")

    @model_validator(mode="after")
    def _one_form(self) -> ApprovalTarget:
        manifest = self.toolManifest is not None or self.checksum is not None
        ledger = self.effectLedger is not None or self.entry is not None
        if manifest and ledger:
            raise ValueError("names both a ToolManifest and an EffectLedger: an Approval decides one thing")
        if manifest and not (self.toolManifest and self.checksum):
            raise ValueError("a ToolManifest target needs both toolManifest and checksum "
                             "(kubectl unwind approve tm/NAME fills in the checksum)")
        if ledger and not (self.effectLedger and self.entry):
            raise ValueError("a ledger target needs both effectLedger and entry")
        if self.argumentsSha256 is not None and not ledger:
            raise ValueError("argumentsSha256 names the arguments of a ledger entry: give "
                             "effectLedger and entry with it")
        if not manifest and not ledger:
            raise ValueError("is empty: name a toolManifest and its checksum, or an effectLedger and an entry")
        return self


class ApprovalSpec(_Status):
    """A recorded decision. The approver's identity is stamped by the webhook, never typed."""

    target: ApprovalTarget = Field(description="What is decided: a ToolManifest version or a ledger entry.")
    decision: Literal["approve", "deny", "settle"] = Field(description="approve or deny; a deny is final for its target. settle (a ledger entry only, with a reason): a person resolved the entry by hand (`kubectl unwind settle`); the operator records it in the entry.")
    reason: str | None = Field(None, max_length=1024, description="Why, in words a reviewer reads later.")

    @model_validator(mode="after")
    def _settle_names_an_entry_and_why(self) -> ApprovalSpec:
        if self.decision == "settle" and not self.target.effectLedger:
            raise ValueError("decision settle settles a ledger entry: name an effectLedger and "
                             "an entry (kubectl unwind settle ledger/RUN ENTRY --reason TEXT)")
        if self.decision == "settle" and not (self.reason or "").strip():
            raise ValueError("decision settle needs a reason: what was done by hand, for the "
                             "record (--reason TEXT)")
        return self


class ApprovalStatus(_Status):
    observedGeneration: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


@dataclass(frozen=True)
class Column:
    name: str
    json_path: str
    type: str = "string"
    priority: int = 0


@dataclass(frozen=True)
class Kind:
    kind: str
    plural: str
    short_names: tuple[str, ...]
    spec: type[BaseModel]
    status: type[BaseModel]
    description: str
    columns: tuple[Column, ...] = field(default_factory=tuple)
    open_spec: bool = False  # keep unknown spec fields so the webhook can refuse typos
    # CEL rules on the spec (x-kubernetes-validations: rule, message), enforced by the API
    # server itself, with no webhook: what must hold whoever writes and whatever runs
    spec_rules: tuple[tuple[str, str], ...] = field(default_factory=tuple)


# What a ledger records never changes (the mutating webhook says so first, and stamps the
# rollback's requester, which a rule cannot: it sees no annotations).
LEDGER_RULES = (
    ("self.run == oldSelf.run",
     "spec.run: is written by the gateway when it creates the ledger and never changes; to undo "
     "the run, set spec.rollback (`kubectl unwind rollback`)"),
    ("(has(self.page) ? self.page : 1) == (has(oldSelf.page) ? oldSelf.page : 1)",
     "spec.page: is written by the gateway when it creates the ledger and never changes"),
    ("has(self.owner) == has(oldSelf.owner) && (!has(self.owner) || self.owner == oldSelf.owner)",
     "spec.owner: is written by the gateway when it creates the ledger and never changes"),
)
# An Approval is a record (the validating webhook also keeps its stamped approver, in
# annotations, which a rule cannot see).
APPROVAL_RULES = (
    ("self == oldSelf",
     "spec: an Approval is a record and cannot be changed after creation; create a new Approval "
     "(a deny is final)"),
)


READY = '.status.conditions[?(@.type=="Ready")].status'

KINDS: tuple[Kind, ...] = (
    Kind("ToolManifest", "toolmanifests", ("tm",), ToolManifest, ToolManifestStatus,
         "A tool an AI agent may call: its effect, permission, approval and undo.",
         (Column("Tool", ".spec.tool"), Column("Effect", ".spec.effect"),
          Column("Lifecycle", ".status.lifecycle"), Column("Version", ".status.version", "integer"),
          Column("Ready", READY), Column("Age", ".metadata.creationTimestamp", "date")),
         open_spec=True),
    Kind("EffectLedger", "effectledgers", ("ledger",), LedgerSpec, LedgerStatus,
         "The record of one agent run's effects, written before and after each call.",
         (Column("Run", ".spec.run"), Column("Entries", ".status.entryCount", "integer"),
          Column("Last State", ".status.lastState"), Column("Live", ".status.live", "integer"),
          Column("Page", ".spec.page", "integer", 1),
          Column("Rolled Back", '.status.conditions[?(@.type=="RolledBack")].reason', "string", 1),
          Column("Requested By", ".status.rollback.requestedBy.user", "string", 1),
          Column("Age", ".metadata.creationTimestamp", "date")),
         spec_rules=LEDGER_RULES),
    Kind("Approval", "approvals", (), ApprovalSpec, ApprovalStatus,
         "A recorded approve or deny decision on a manifest version or a ledger entry.",
         (Column("Decision", ".spec.decision"), Column("ToolManifest", ".spec.target.toolManifest"),
          Column("Ledger", ".spec.target.effectLedger"), Column("Entry", ".spec.target.entry"),
          Column("Approver", r".metadata.annotations.unwind\.dev/approver"),
          Column("Age", ".metadata.creationTimestamp", "date")),
         spec_rules=APPROVAL_RULES),
)
