"""What the step runner (``unwind undo-step``) is given for one step, and its stable key.

The input holds everything the runner needs and nothing it must look up: the plan step,
the manifest of the tool it calls (today's: that is the upstream it reaches), the resolved
read-back, the step's idempotency key, and for a lookup the manifest and handle of the
entry (so the runner can return the completed handle). A Job passes it as one JSON value
(env ``UNWIND_STEP``), so it is self-contained; the local rollback builds the same value.

The key is derived from the ledger's identity, the entry and the action, so every retry
of a step, from any process, sends the same key and the upstream can deduplicate the undo.
The identity is the ledger object's, not its name: a run name is often reused (a CI job's
``--run``), and a fresh ledger of the same name must never send the keys of an old one's
rollback (the upstream would replay its old answer and nothing would be undone). In a
cluster it is the first page's namespace and uid; a local ledger file holds a uid written
when the gateway created it. A ledger written before that has none: its identity is then a
digest of its first entry's id and request time, which no fresh ledger repeats unless it
reuses that id in the same millisecond.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..manifest.model import Absent, ToolManifest
from .entry import Entry, Handle
from .plan import Action, PlanError, Step, Versions

FORMAT_VERSION: Literal[1] = 1


def ledger_identity(namespace: str | None, uid: str | None, entries: Sequence[Entry]) -> str:
    """What tells this ledger from any other of the same name (see the module docstring):
    ``uid:<namespace>/<uid>``, else ``first:<digest>`` of the first entry."""
    if uid:
        return f"uid:{namespace or ''}/{uid}"
    first = min(entries, key=lambda e: (e.seq, e.times.requested), default=None)
    if first is None:
        return "empty"
    text = f"{first.id}\0{first.times.requested}"
    return "first:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def step_key(identity: str, entry: str, action: str) -> str:
    """``unwind-<action>-<32 hex>``: the same for every attempt of one step of one ledger
    (``identity``, from :func:`ledger_identity`), distinct for every other step and every
    other ledger; short enough for any upstream's key limit, a valid header value."""
    digest = hashlib.sha256(f"{identity}\0{entry}\0{action}".encode()).hexdigest()[:32]
    return f"unwind-{action}-{digest}"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlanStep(_Model):
    entry: str
    tool: str
    action: Action
    undo_tool: str | None
    arguments: dict[str, Any] | None
    residue: list[str] = Field(default_factory=list)
    requires_approval: bool = False
    reason: str = ""
    object: str | None = None
    headers: dict[str, Any] = Field(default_factory=dict)
    read_before: dict[str, Any] | None = None


class CurrentInput(_Model):
    """``compensation.current``: the read right before the undo; ``binds`` fills
    ``arguments.<name>`` and ``headers.<name>`` from its answer (``$current.<path>``)."""

    manifest: ToolManifest = Field(description="The read_only tool that reads the object now.")
    arguments: dict[str, Any]
    binds: dict[str, str] = Field(default_factory=dict)


class ReadBackInput(_Model):
    manifest: ToolManifest = Field(description="The read_only verification tool.")
    arguments: dict[str, Any]
    expect: dict[str, Any] = Field(default_factory=dict)
    retries: int = Field(ge=1, le=10)
    backoff_ms: int = Field(ge=0)
    left: dict[str, Any] | None = Field(
        None, description="With a capture: expect path -> what the call left there. The runner "
                          "reads the state before the undo and reports diverged when a field "
                          "no longer holds it.")
    absent: Absent | None = Field(None, description="The read-back proves the thing gone.")
    done_statuses: list[int] = Field(default_factory=list, description="The undo call's statuses "
                                     "that count as done when the read-back confirms.")

    @model_validator(mode="after")
    def _expects_or_absent(self) -> ReadBackInput:
        if bool(self.expect) == (self.absent is not None):
            raise ValueError("give expect (at least one entry) or absent, exactly one")
        return self


class EffectInput(_Model):
    manifest: ToolManifest = Field(description="The manifest the entry ran under.")
    handle: Handle


class StepInput(_Model):
    version: Literal[1] = FORMAT_VERSION
    ledger: str = Field(min_length=1)
    step: PlanStep
    idempotency_key: str | None = Field(None, description="Sent with an undo call; null for a lookup.")
    manifest: ToolManifest = Field(description="The tool the step calls: the undo, discard or lookup tool.")
    verification: ReadBackInput | None = None
    timeout_ms: int | None = Field(None, description="compensation.timeout_ms, for whoever runs the step.")
    effect: EffectInput | None = Field(None, description="A lookup step's entry: to complete its handle.")
    current: CurrentInput | None = Field(None, description="The read right before the undo (compensation.current).")


def step_input(ledger: str, step: Step, entry: Entry, versions: Versions, *,
               identity: str) -> dict[str, Any]:
    """The runner's input for one runnable step of a plan made with ``versions``, in the
    ledger ``ledger`` whose identity is ``identity`` (:func:`ledger_identity`)."""
    if step.action not in ("inverse", "compensate", "discard", "lookup") or step.undo_tool is None:
        raise PlanError(f"the {step.action} step of entry {step.entry} runs nothing")
    called = _today(versions, step.undo_tool, step)
    out: dict[str, Any] = {
        "version": FORMAT_VERSION, "ledger": ledger, "step": step.to_json(),
        "idempotency_key": None if step.action == "lookup" else step_key(identity, step.entry,
                                                                          step.action),
        "manifest": called.canonical_dict(), "verification": None, "timeout_ms": step.timeout_ms,
        "effect": None,
    }
    if step.read_before is not None and step.action != "lookup":
        r = step.read_before
        out["current"] = {"manifest": _today(versions, r.tool, step).canonical_dict(),
                          "arguments": r.arguments, "binds": dict(r.binds)}
    v = step.verification
    if v is not None:
        out["verification"] = {"manifest": _today(versions, v.tool, step).canonical_dict(),
                               "arguments": v.arguments, "expect": v.expect,
                               "retries": v.retries, "backoff_ms": v.backoff_ms}
        if v.absent is not None:
            out["verification"]["absent"] = v.absent.model_dump(mode="json")
        if v.done_statuses:
            out["verification"]["done_statuses"] = list(v.done_statuses)
        if v.left:
            out["verification"]["left"] = dict(v.left)
    if step.action == "lookup":
        m, _ = versions.of(entry)
        if m is None:
            raise PlanError(f"no manifest of {entry.tool} for entry {entry.id}")
        out["effect"] = {"manifest": m.canonical_dict(),
                         "handle": (entry.handle or Handle()).model_dump(mode="json",
                                                                         exclude_none=True)}
    return out


def _today(versions: Versions, tool: str, step: Step) -> ToolManifest:
    m = versions.tools.get(tool)
    if m is None:
        raise PlanError(f"the {step.action} step of entry {step.entry} calls {tool}, which is not "
                        "among today's manifests (-m): give its manifest")
    return m
