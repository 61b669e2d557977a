"""`unwind plan`, `unwind rollback`, `unwind undo-step` and `unwind ledger export|verify`.

`plan` shows what a rollback of a run will do (pure: it calls nothing); `rollback` runs it
locally against a ledger file; `undo-step` runs one step (the Job's entry point in a
cluster); `ledger export` writes signed evidence of a run, `ledger verify` checks it.
See docs/rollback.md.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from .output import emit, fail

DEFAULT_TERMINATION_LOG = "/dev/termination-log"


# ---- plan ----

def _when(args: argparse.Namespace) -> datetime:
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


def _selection(args: argparse.Namespace) -> Any:
    from ..ledger.plan import Selection

    if args.entry and args.since:
        raise ValueError("give --entry or --since, not both")
    return Selection(entries=tuple(args.entry or ()), since=args.since)


def _inputs(args: argparse.Namespace) -> tuple[Any, Any, Any, datetime]:
    from ..undo.sources import load_versions, read_ledger_file

    snap = read_ledger_file(args.ledger)
    versions = load_versions(args.manifests, args.versions or (), current=args.current)
    return snap, versions, _selection(args), _when(args)


def cmd_plan(args: argparse.Namespace) -> int:
    from ..ledger.plan import PlanError, make_plan
    from ..undo.sources import SourceError

    try:
        snap, versions, selection, moment = _inputs(args)
        plan = make_plan(snap.name, snap.entries, versions, now=moment, selection=selection)
    except (SourceError, PlanError, ValueError) as exc:
        return fail(args, "plan", str(exc))
    if args.json:
        emit(plan.to_json())
    else:
        sys.stdout.write(format_plan(plan))
    return 0


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
    summary = (f"ledger {plan.ledger}: {len(run)} of {len(steps)} steps run"
               f"{f', {approval} need approval' if approval else ''}; left behind: "
               f"{residue} with residue, {left['not_undoable']} not undoable, "
               f"{left['unrecoverable']} unrecoverable")
    return "\n".join(lines) + "\n" + summary + "\n"


# ---- rollback ----

def cmd_rollback(args: argparse.Namespace) -> int:
    from ..gateway.secrets import LocalSecrets
    from ..ledger.plan import PlanError
    from ..undo.local import execute, open_ledger, plan_local
    from ..undo.sources import SourceError, load_versions

    try:
        ledger = open_ledger(args.ledger)
        versions = load_versions(args.manifests, args.versions or (), current=args.current)
        selection = _selection(args)
        plan = plan_local(ledger, versions, selection, _when(args))
    except (SourceError, PlanError, ValueError) as exc:
        return fail(args, "rollback", str(exc))
    print(format_plan(plan), end="")
    if not plan.runnable():
        print("nothing to run")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            return fail(args, "not_confirmed", "not confirmed: review the plan and run again "
                        "with --yes (standard input is not a terminal to ask)")
        answer = input(f"run {len(plan.runnable())} steps now? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("nothing was run")
            return 1
    by = args.by or os.environ.get("UNWIND_ACTOR") or f"local:{getpass.getuser()}"

    def report(step: Any, result: dict[str, Any]) -> None:
        mark = "ok  " if result["ok"] else "FAIL"
        print(f"{mark} {step.entry} {step.action} {result['tool']}: {result['outcome']}: "
              f"{result['reason']}", flush=True)
    try:
        summary = asyncio.run(execute(ledger, plan, versions, selection, by=by,
                                      secrets=LocalSecrets(args.secrets_dir), report=report))
    except (SourceError, PlanError) as exc:
        return fail(args, "rollback", str(exc))
    if summary.stopped is not None:
        s = summary.stopped
        mismatch = f" (first mismatch: {s['first_mismatch']})" if s.get("first_mismatch") else ""
        print(f"error: stopped at entry {s['entry']}: {s['reason']}{mismatch}; the steps after it "
              "did not run: fix the cause and run the rollback again", file=sys.stderr)
        return 1
    left = ", ".join(f"{s.entry} ({s.action})" for s in summary.left)
    print(f"rolled back: {len(summary.results)} steps ran" + (f"; left behind: {left}" if left else ""))
    return 0


# ---- undo-step ----

def read_step_text(args: argparse.Namespace) -> str:
    """The step input: --step FILE (``-`` is standard input), else $UNWIND_STEP, else
    standard input when it is not a terminal."""
    if args.step and args.step != "-":
        return Path(args.step).read_text(encoding="utf-8")
    if args.step == "-":
        return sys.stdin.read()
    if os.environ.get("UNWIND_STEP"):
        return os.environ["UNWIND_STEP"]
    if not sys.stdin.isatty():
        return sys.stdin.read()
    raise ValueError("no step given: pass --step FILE, set UNWIND_STEP, or pipe the step's JSON in")


def termination_log() -> str | None:
    path = os.environ.get("UNWIND_TERMINATION_LOG")
    if path:
        return path
    if os.path.exists(DEFAULT_TERMINATION_LOG) and os.access(DEFAULT_TERMINATION_LOG, os.W_OK):
        return DEFAULT_TERMINATION_LOG
    return None


def cmd_undo_step(args: argparse.Namespace) -> int:
    from ..gateway.secrets import LocalSecrets
    from ..gateway.upstream import Upstream
    from ..undo.runner import fit, parse_step, run_step

    async def run(spec: Any) -> dict[str, Any]:
        upstream = Upstream()
        try:
            return await run_step(spec, upstream, LocalSecrets(args.secrets_dir
                                                               or os.environ.get("UNWIND_SECRETS_DIR")))
        finally:
            await upstream.aclose()
    try:
        spec = parse_step(json.loads(read_step_text(args)))
    except (OSError, ValueError) as exc:
        result: dict[str, Any] = {"ok": False, "outcome": "invalid_step", "entry_state": None,
                                  "reason": str(exc)}
    else:
        result = asyncio.run(run(spec))
    line = fit(result)
    print(line, flush=True)
    where = termination_log()
    if where:
        try:
            Path(where).write_text(line, encoding="utf-8")
        except OSError as exc:
            print(f"warning: cannot write the termination message to {where}: "
                  f"{exc.strerror or exc}", file=sys.stderr)
    if not result["ok"]:
        print(f"error: {result['reason']}", file=sys.stderr)
    return 0 if result["ok"] else 1


# ---- registration ----

def _plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ledger", required=True, metavar="FILE", help="a ledger file: "
                   "<ledger-dir>/<run>.json of the local gateway, or `kubectl get effectledger "
                   "NAME -o json` saved (its pages are read too)")
    p.add_argument("-m", "--manifests", nargs="+", required=True, metavar="PATH",
                   help="today's manifests (files or folders, one set)")
    p.add_argument("--versions", nargs="+", metavar="PATH", help="older manifest versions the "
                   "entries may have run under (matched by checksum)")
    p.add_argument("--current", action="store_true", help="plan an entry whose manifest version "
                   "is not given with today's manifest of its tool (the step says so)")
    p.add_argument("--since", metavar="ID", help="only what came after this entry (or at or "
                   "after this RFC 3339 time)")
    p.add_argument("--entry", nargs="+", metavar="ID", help="only these entries, and the later "
                   "entries of tools that require theirs")
    p.add_argument("--now", metavar="TIME", help="plan as of this RFC 3339 time (deadlines; "
                   "default now)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="show what a rollback of a run would do (calls nothing)",
                       description="The undo plan of a run's ledger: each entry's step in "
                       "execution order, with the undo tool, residue, approval and why. "
                       "See docs/rollback.md.")
    _plan_flags(p)
    p.add_argument("--json", action="store_true", help="the plan as JSON")
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("rollback", help="run a run's undo plan locally, recording each outcome "
                       "in the ledger file", description="Show the plan, ask (unless --yes), run "
                       "its steps in order and record each in the ledger file; run again to "
                       "resume. See docs/rollback.md.")
    _plan_flags(p)
    p.add_argument("--yes", action="store_true", help="run without asking (the plan is "
                   "printed first all the same)")
    p.add_argument("--by", metavar="NAME", help="who runs (and so approves) the rollback, "
                   "recorded in each entry (default UNWIND_ACTOR, else local:<user>)")
    p.add_argument("--secrets-dir", metavar="DIR", help="secrets as DIR/<name>/<key> files "
                   "(the environment's UNWIND_SECRET_<NAME>_<KEY> is read too)")
    p.set_defaults(func=cmd_rollback)

    p = sub.add_parser("undo-step", help="run one undo step and print its result as one JSON "
                       "line (the rollback Job's entry point)",
                       description="Run one step: the undo call with the step's idempotency "
                       "key, then the read-back; or a lookup. Input: --step FILE, else "
                       "$UNWIND_STEP, else standard input. The result goes to standard output "
                       "and to $UNWIND_TERMINATION_LOG (default /dev/termination-log when "
                       "writable). Exit 0 on success, 1 on failure. See docs/rollback.md.")
    p.add_argument("--step", metavar="FILE", help="the step's JSON (- for standard input)")
    p.add_argument("--secrets-dir", metavar="DIR", help="secrets as DIR/<name>/<key> files "
                   "(default $UNWIND_SECRETS_DIR; the environment is read too)")
    p.set_defaults(func=cmd_undo_step)
