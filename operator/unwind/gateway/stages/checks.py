"""The checks a call passes before anything is stored: the tool served and enforceable (in
``enforce.py``, from its call plan), the stage form, the permission in scope, every
``requires`` tool succeeded earlier in the run, the upstream's input schema not drifted.
Observe mode records a failed check as a warning instead of refusing.
"""

from __future__ import annotations

from typing import Any

from ...manifest.lint import schema_hash_of
from ...manifest.model import ToolManifest
from ...manifest.refs import resolve_map
from ...upstream.errors import Refusal
from ..callstate import Call as _Call
from .base import Stage


class Checks(Stage):
    def _observed(self, c: _Call, refusal: Refusal) -> None:
        """Observe mode: the violation goes into the entry's warnings and the metrics, and
        the call goes on (the write-ahead ledger and duplicate refusal stay in force)."""
        assert c.m is not None
        c.warnings.append(f"observed {refusal.code}: {refusal.message}")
        self.metrics.observed.labels(c.m.tool, refusal.code).inc()

    def _stage_form(self, c: _Call) -> tuple[ToolManifest, dict[str, Any]]:
        m = c.m
        assert m is not None
        if m.draft is None:
            raise Refusal("unsupported_operation", f"{m.tool} has no draft form, so it cannot be "
                          "staged: call it without stage (the real effect) or not at all")
        served = self.catalogue.get(m.draft.tool)
        if served is None or not served.manifest.enforceable:
            raise Refusal("unsupported_operation", f"the draft tool {m.draft.tool} of {m.tool} "
                          "is not served here")
        args, missing = resolve_map(m.draft.arguments, c.req.arguments, None)
        if missing:
            raise Refusal("validation_error", "the draft cannot be filled: " + "; ".join(missing))
        return served.manifest, args

    async def _permission(self, c: _Call) -> Refusal | None:
        m = c.m
        assert m is not None
        scopes = self.settings.scopes
        if "*" in scopes or m.permission in scopes:
            return None
        held = ", ".join(sorted(scopes)) or "none"
        return Refusal("permission_denied", f"{m.tool} needs permission {m.permission}; this "
                       f"gateway's scopes are {held}")

    async def _requires(self, c: _Call) -> Refusal | None:
        m = c.m
        assert m is not None
        if not m.requires:
            return None
        entries = await self.ledger(self.store.entries(c.req.run))
        done = {e.tool for e in entries if e.state == "succeeded"}
        missing = [r.tool for r in m.requires if r.tool not in done]
        if not missing:
            return None
        return Refusal("requires_not_met", f"{m.tool} requires {', '.join(missing)} to have "
                       f"succeeded earlier in run {c.req.run}: call it first")

    async def _schema_drift(self, c: _Call) -> Refusal | None:
        m = c.m
        assert m is not None
        if not m.schema_hash or m.upstream is None or m.upstream.mcp is None:
            return None
        schema = self.upstream.schemas.get((m.upstream.mcp.target, m.upstream.mcp.tool))
        if schema is None:
            return None  # not known: nothing to compare
        seen = schema_hash_of(schema)
        if seen == m.schema_hash:
            return None
        return Refusal("schema_drift", f"the input schema of {m.tool} changed since its manifest "
                       f"was approved ({m.schema_hash} then, {seen} now): review the manifest "
                       "again")
