"""Is a ToolManifest version approved? The tally over its Approvals and its applier.

A version (a spec checksum) is enforced only when someone decided so:

- an Approval with ``decision: approve`` targets that checksum, from an approver whose
  identity the webhook stamped; with four-eyes (the default) the approver must not be the
  identity that last changed the spec;
- or the spec says ``lifecycle: approved``/``deprecated`` and was applied by a trusted
  applier (a GitOps controller: the review happened in git).

A ``deny`` from a stamped identity is final for that checksum: approvals before or after
it do not count, and only a new spec (a new checksum) can be approved again.

Pure code: the operator gathers the Approvals, this decides, reconcile.py reports.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..api.resources import ApprovalSpec
from ..registry.signing import TrustStore
from .identity import Identity, stamped_identity


@dataclass(frozen=True)
class ApprovalObject:
    """An Approval as the operator lists it (raw: checked here, not at listing)."""

    name: str
    created: str
    spec: Any
    annotations: Mapping[str, str] = field(default_factory=dict)

    def meta(self) -> dict[str, str]:
        """What the approver's stamp is bound to: its name and creation time (an Approval is
        stamped when it is created, before it has a uid)."""
        return {"name": self.name, "creationTimestamp": self.created}


@dataclass(frozen=True)
class Decision:
    name: str
    created: str
    verb: str  # approve | deny
    checksum: str
    reason: str
    who: Identity


@dataclass(frozen=True)
class Verdict:
    state: str  # approved | denied | none
    by: Decision | None = None
    ignored: tuple[str, ...] = ()  # one sentence per Approval that did not count

    def note(self) -> str:
        return f" (not counted: {'; '.join(self.ignored)})" if self.ignored else ""


def decisions_by_manifest(namespace: str, approvals: Iterable[ApprovalObject],
                          trust: TrustStore) -> tuple[dict[str, list[Decision]], dict[str, list[str]]]:
    """Stamped decisions per target ToolManifest name, and per name the Approvals that were
    ignored because their approver is not stamped (written around the webhook)."""
    found: dict[str, list[Decision]] = {}
    unstamped: dict[str, list[str]] = {}
    for a in sorted(approvals, key=lambda a: (a.created, a.name)):
        try:
            spec = ApprovalSpec.model_validate(a.spec)
        except ValueError:
            continue
        target = spec.target.toolManifest
        if not target or not spec.target.checksum:
            continue
        who, why = stamped_identity("Approval", namespace, a.spec, a.annotations, trust, a.meta())
        if who is None:
            unstamped.setdefault(target, []).append(f"Approval {a.name}: {why}")
            continue
        found.setdefault(target, []).append(
            Decision(a.name, a.created, spec.decision, spec.target.checksum, spec.reason or "", who))
    return found, unstamped


def tally(decisions: Sequence[Decision], checksum: str, author: Identity | None,
          four_eyes: bool) -> Verdict:
    """The verdict on one version from the decisions that name its manifest."""
    ignored: list[str] = []
    approve: Decision | None = None
    for d in decisions:
        if d.checksum != checksum:
            continue
        if d.verb == "deny":
            return Verdict("denied", d)
        if four_eyes and author is not None and d.who.user == author.user:
            ignored.append(f"Approval {d.name} is by {d.who.user}, who last changed the spec "
                           "(four-eyes needs someone else)")
        elif approve is None:
            approve = d
    return Verdict("approved", approve, tuple(ignored)) if approve else Verdict("none", None, tuple(ignored))


def is_trusted(who: Identity | None, trusted: Sequence[str]) -> bool:
    return who is not None and ("*" in trusted or who.user in trusted)


def applier(namespace: str, spec: Any, annotations: Mapping[str, str],
            trust: TrustStore, meta: Mapping[str, Any] | None = None) -> tuple[Identity | None, str]:
    """Who last changed the spec, when the stamp verifies for this object (``meta``: its
    name, uid and creationTimestamp)."""
    return stamped_identity("ToolManifest", namespace, spec, annotations, trust, meta)
