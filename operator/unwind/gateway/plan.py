"""A tool's call plan: what enforcing a call of it needs that the manifest alone decides,
worked out once per bundle instead of on every call.

A plan holds the served manifest (checksum, version), whether it is enforceable and, if
not, why; its deprecation warning; its approval rules; whether a keyed call takes its key's
lock together with its write-ahead (no approval, no capture: one round trip to a cluster
ledger); the key's carrier (argument or header); its capture's served read-only tool; the
longest its upstream call may take (timeouts, retries, backoffs) for deadlines; and its
metric labels. A call then runs only what depends on the call itself (arguments, run, the
ledger's answers).

``Plans`` compiles a tool's plan on the first call that names it after a bundle is served
and keeps it for as long as the catalogue serves that same manifest object: a reload serves
new ``Served`` objects and a new generation, and the plans of the old one are dropped in one
assignment, so a call sees the old plan or the new one, never half of each. Secret values
(upstream headers) stay resolved per call: a mounted Secret that rotates is read afresh.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ledger.approvals import ApprovalRules
from ..manifest.model import Effect, ToolManifest
from .catalogue import Catalogue, Served
from .keylocks import manifest_ms


@dataclass(frozen=True, slots=True)
class CallPlan:
    served: Served
    manifest: ToolManifest
    tool: str
    effect: str
    enforceable: bool
    deprecated: str | None  # the warning every call of a deprecated tool carries
    approval: ApprovalRules | None
    keyed: bool  # the manifest renders an idempotency key
    together: bool  # a keyed call's lock goes with its write-ahead (no approval, no capture)
    carrier_argument: str | None
    carrier_header: str | None
    call_ms: int  # the longest the upstream call may take: attempts, timeouts, backoffs
    read_only: bool


def compile_plan(served: Served) -> CallPlan:
    m = served.manifest
    approval = ApprovalRules.from_manifest(m)
    carrier = m.idempotency.carrier if m.idempotency else None
    deprecated = None
    if m.lifecycle == "deprecated":
        deprecated = (f"{m.tool} is deprecated: use {m.replaced_by}" if m.replaced_by
                      else f"{m.tool} is deprecated")
    keyed = m.idempotency is not None
    return CallPlan(
        served=served, manifest=m, tool=m.tool, effect=str(m.effect), enforceable=m.enforceable,
        deprecated=deprecated, approval=approval, keyed=keyed,
        together=keyed and approval is None and m.capture is None,
        carrier_argument=carrier.argument if carrier else None,
        carrier_header=carrier.header if carrier else None,
        call_ms=manifest_ms(m) if m.upstream is not None else 0,
        read_only=m.effect == Effect.read_only)


class Plans:
    """The plans of the tools a catalogue serves, compiled on first use per generation."""

    def __init__(self, catalogue: Catalogue) -> None:
        self.catalogue = catalogue
        self._generation: str | None = None
        self._by_tool: dict[str, CallPlan] = {}

    def get(self, tool: str) -> CallPlan | None:
        served = self.catalogue.get(tool)
        if served is None:
            return None
        generation = self.catalogue.generation
        if generation != self._generation:  # a reload: the old plans go, all at once
            self._by_tool, self._generation = {}, generation
        plan = self._by_tool.get(tool)
        if plan is None or plan.served is not served:
            plan = self._by_tool[tool] = compile_plan(served)
        return plan
