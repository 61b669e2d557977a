"""The effect report: what a call did and how to undo it, as the caller receives it.

It rides in ``X-Unwind-Effect`` (REST) and ``_meta.effect`` (MCP), and the ledger entry
keeps a copy. It is built from the handle, never from the whole call, so the report and
the ledger cannot disagree about the undo, and a redacted value never reaches either.
"""

from __future__ import annotations

from typing import Any, Literal

from ..manifest.model import Effect, ToolManifest
from ..manifest.refs import Missing, parse_ref, resolve, resolve_map
from .entry import Handle, Staged, parse_stamp
from .handle import kept_references, redacted_needs

Outcome = Literal["succeeded", "failed", "uncertain", "refused", "planned"]


def undo_of(m: ToolManifest, handle: Handle | None, outcome: Outcome,
            key: str | None) -> tuple[dict[str, Any] | None, str | None]:
    """(undo {kind, tool, arguments} or None, why there is no undo or None)."""
    c = m.compensation
    if m.effect == Effect.irreversible:
        return None, f"{m.tool} is irreversible: nothing can undo it"
    if m.effect not in (Effect.reversible, Effect.compensable) or c is None:
        return None, None  # read_only and idempotent leave nothing to undo
    if outcome in ("failed", "refused"):
        return None, None
    if outcome == "uncertain":
        return None, ("the answer was lost, so the undo's arguments are unknown: find the "
                      "effect with the lookup first" if m.lookup else
                      "the answer was lost and the tool declares no lookup: the effect "
                      "cannot be found or undone automatically")
    refs = [(w, r) for w, r in kept_references(m)
            if w.startswith("compensation.argument_map.")]
    masked = redacted_needs(m, refs)
    if masked:
        return None, "the undo is unavailable: " + "; ".join(masked)
    h = handle or Handle()
    # $current is read right before the undo runs, so no call's answer holds it: those
    # arguments are named in undo.current.fills for whoever runs the undo, never "missing"
    later = {k: v for k, v in c.argument_map.items() if parse_ref(v).root == "current"}
    now = {k: v for k, v in c.argument_map.items() if k not in later}
    if outcome == "planned":  # a dry run: the answer's values are not known yet
        known = {k: v for k, v in now.items()
                 if parse_ref(v).root not in ("result", "before")}  # nor the capture's
        args, _ = resolve_map(known, h.args, h.result, key)
    else:
        args, missing = resolve_map(now, h.args, h.result, key, h.before)
        if missing:
            return None, "the undo is unavailable: " + "; ".join(missing)
    kind = "inverse" if c.kind == "inverse" else "compensate"
    undo: dict[str, Any] = {"kind": kind, "tool": c.tool, "arguments": args}
    if c.current is not None:
        read, _ = resolve_map(c.current.arguments, h.args, h.result, key, h.before)
        fills = {f"arguments.{k}": v for k, v in later.items()}
        fills |= {f"headers.{k}": v for k, v in (c.headers or {}).items()
                  if parse_ref(v).root == "current"}
        undo["current"] = {"tool": c.current.tool, "arguments": read, "fills": fills}
    return undo, None


def deadline_ms(m: ToolManifest, handle: Handle | None, finished: str | None) -> int | None:
    """Milliseconds the inverse stays possible, counted from the answer."""
    c = m.compensation
    if c is None or c.deadline is None:
        return None
    if c.deadline.within_ms is not None:
        return c.deadline.within_ms
    if c.deadline.at is None or handle is None or finished is None:
        return None
    value = resolve(parse_ref(c.deadline.at), handle.args, handle.result)
    try:
        if isinstance(value, bool | Missing):
            return None
        end = (value if isinstance(value, int | float)
               else parse_stamp(str(value)).timestamp() * 1000)
        start = parse_stamp(finished).timestamp() * 1000
    except ValueError:
        return None
    return max(0, int(end - start))


def lookup_of(m: ToolManifest, handle: Handle | None, key: str | None) -> dict[str, Any] | None:
    if m.lookup is None:
        return None
    h = handle or Handle()
    args, _ = resolve_map(m.lookup.arguments, h.args, h.result, key)
    return {"tool": m.lookup.tool, "by": m.lookup.by, "arguments": args}


def effect_report(m: ToolManifest, *, outcome: Outcome, handle: Handle | None,
                  key_sent: str | None, key: str | None, ledger: str, entry: str,
                  staged: Staged | None = None, warnings: list[str] | None = None,
                  finished: str | None = None) -> dict[str, Any]:
    """The report with exactly the documented fields (docs/gateway.md)."""
    undo: dict[str, Any] | None = None
    why: str | None = "a staged call made a draft: discard it with the staged discard tool"
    if staged is None:
        undo, why = undo_of(m, handle, outcome, key_sent or key)
    return {
        "class": str(m.effect),
        "tool": m.tool,
        "idempotency_key": key_sent,
        "undo": undo,
        "undo_unavailable": why,
        "deadline_ms": deadline_ms(m, handle, finished) if outcome != "failed" else None,
        "lookup": lookup_of(m, handle, key_sent or key),
        "ledger": {"name": ledger, "entry": entry},
        "staged": staged.model_dump(mode="json") if staged else None,
        "warnings": list(warnings or []),
    }

