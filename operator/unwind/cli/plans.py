"""What both forms of `unwind plan|rollback` share: reading the selection flags and showing
a plan.

A run's ledger is a file (rollback_cmds.py: `--ledger FILE`) or an EffectLedger in the
cluster (plugin_cmds.py: `ledger/NAME`); either way the same planner makes the plan, from the
same flags, and a reviewer reads it the same way. This module imports no command module,
so both can import it.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from typing import Any

from .output import emit, plural


def parse_now(args: argparse.Namespace) -> datetime:
    """The moment to plan as of: --now (an RFC 3339 time with its zone), else now.
    ValueError says what to type instead."""
    from ..ledger.entry import now, parse_stamp

    if not getattr(args, "now", None):
        return now()
    try:
        moment = parse_stamp(args.now)
    except ValueError:
        raise ValueError(f"--now {args.now}: give an RFC 3339 time, e.g. 2026-01-31T10:00:00Z") from None
    if moment.tzinfo is None:
        raise ValueError(f"--now {args.now}: give the time zone too, e.g. 2026-01-31T10:00:00Z")
    return moment


def parse_selection(args: argparse.Namespace) -> Any:
    """Which entries to undo (a ledger.plan.Selection): --entry or --since, else all.
    ValueError when both are given."""
    from ..ledger.plan import Selection

    if args.entry and args.since:
        raise ValueError("give --entry or --since, not both")
    return Selection(entries=tuple(args.entry or ()), since=args.since)


def show_plan(plan: Any, fmt: str) -> None:
    """Print the plan: one document for -o json|yaml, else the table of format_plan."""
    if fmt != "text":
        emit(plan.to_json(), fmt)
    else:
        sys.stdout.write(format_plan(plan))


def format_plan(plan: Any) -> str:
    """The plan as a reviewer reads it: one row per step, why beneath, residue beneath."""
    steps = plan.steps
    if not steps:
        return f"ledger {plan.ledger}: nothing selected to undo\n"
    rows = [("#", "ENTRY", "TOOL", "ACTION", "UNDO TOOL", "APPROVAL")]
    for i, s in enumerate(steps, 1):
        rows.append((str(i), s.entry, s.tool, s.action, s.undo_tool or "-",
                     "needed" if s.requires_approval else "-"))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n:
            s = steps[n - 1]
            pad = " " * (widths[0] + 2)
            lines.append(f"{pad}why: {s.reason}")
            lines.extend(f"{pad}residue: {r}" for r in s.residue)
    run = [s for s in steps if s.action in ("inverse", "compensate", "discard", "lookup")]
    left = {a: sum(1 for s in steps if s.action == a) for a in ("not_undoable", "unrecoverable")}
    residue = sum(1 for s in steps if s.residue)
    approval = sum(1 for s in steps if s.requires_approval)
    summary = (f"ledger {plan.ledger}: {len(run)} of {plural(len(steps), 'step')} run"
               f"{f', {approval} need approval' if approval else ''}; left behind: "
               f"{residue} with residue, {left['not_undoable']} not undoable, "
               f"{left['unrecoverable']} unrecoverable")
    return "\n".join(lines) + "\n" + summary + "\n"
