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

from .output import add_output_flags, emit, fail, output_format, plural

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


def _cluster_or_local(args: argparse.Namespace, command: str) -> str | None:
    """Which form: "cluster" (ledger/NAME, kubectl plugin_cmds), else None after checking the
    local form's required flags; a problem as an error message."""
    if args.target:
        if args.ledger:
            raise ValueError("give ledger/NAME or --ledger FILE, not both")
        return "cluster"
    missing = [f for f, v in (("--ledger FILE", args.ledger), ("-m MANIFESTS", args.manifests)) if not v]
    if missing:
        raise ValueError(f"{command} needs {' and '.join(missing)} (a local ledger), or ledger/NAME "
                         "for a ledger in the cluster")
    return None


def cmd_plan(args: argparse.Namespace) -> int:
    from ..ledger.plan import PlanError, make_plan
    from ..undo.sources import SourceError

    try:
        if _cluster_or_local(args, "plan"):
            from .plugin_cmds import cmd_cluster_plan

            return cmd_cluster_plan(args)
    except ValueError as exc:
        return fail(args, "usage", str(exc), 2)
    try:
        snap, versions, selection, moment = _inputs(args)
        plan = make_plan(snap.name, snap.entries, versions, now=moment, selection=selection)
    except (SourceError, PlanError, ValueError) as exc:
        return fail(args, "plan", str(exc))
    if output_format(args) != "text":
        emit(plan.to_json(), output_format(args))
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
    summary = (f"ledger {plan.ledger}: {len(run)} of {plural(len(steps), 'step')} run"
               f"{f', {approval} need approval' if approval else ''}; left behind: "
               f"{residue} with residue, {left['not_undoable']} not undoable, "
               f"{left['unrecoverable']} unrecoverable")
    return "\n".join(lines) + "\n" + summary + "\n"


# ---- rollback ----

def cmd_rollback(args: argparse.Namespace) -> int:
    from ..ledger.plan import PlanError
    from ..ledger.store import StoreUnavailable
    from ..manifest.rewrite import parse_rewrite
    from ..undo.local import execute, open_ledger, plan_local
    from ..undo.sources import SourceError, load_versions
    from ..upstream.secrets import LocalSecrets

    try:
        if _cluster_or_local(args, "rollback"):
            from .plugin_cmds import cmd_cluster_rollback

            return cmd_cluster_rollback(args)
    except ValueError as exc:
        return fail(args, "usage", str(exc), 2)
    if args.reason or args.watch:
        return fail(args, "usage", "--reason and --watch are for a cluster ledger (ledger/NAME)", 2)
    try:
        ledger = open_ledger(args.ledger)
        rewrite = [parse_rewrite(r) for r in args.rewrite_upstream or []]
        versions = load_versions(args.manifests, args.versions or (), current=args.current, rewrite=rewrite)
        selection = _selection(args)
        moment = _when(args) if args.now else None
        plan = plan_local(ledger, versions, selection, moment)
    except (SourceError, PlanError, StoreUnavailable, ValueError) as exc:
        return fail(args, "rollback", str(exc))
    print(format_plan(plan), end="")
    if not plan.runnable():
        print("nothing to run")
        return 0
    if not args.yes:
        if not sys.stdin.isatty():
            return fail(args, "not_confirmed", "not confirmed: review the plan and run again "
                        "with --yes (standard input is not a terminal to ask)")
        answer = input(f"run {plural(len(plan.runnable()), 'step')} now? [y/N] ").strip().lower()
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
                                      secrets=LocalSecrets(args.secrets_dir), report=report,
                                      moment=moment))
    except (SourceError, PlanError, StoreUnavailable) as exc:
        return fail(args, "rollback", str(exc))
    if summary.stopped is not None:
        s = summary.stopped
        mismatch = f" (first mismatch: {s['first_mismatch']})" if s.get("first_mismatch") else ""
        print(f"error: stopped at entry {s['entry']}: {s['reason']}{mismatch}; the steps after it "
              "did not run: fix the cause and run the rollback again", file=sys.stderr)
        return 1
    left = ", ".join(f"{s.entry} ({s.action})" for s in summary.left)
    print(f"rolled back: {plural(len(summary.results), 'step')} ran" + (f"; left behind: {left}" if left else ""))
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
    from ..undo.runner import fit, parse_step, run_step
    from ..upstream.client import Upstream
    from ..upstream.secrets import LocalSecrets

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


# ---- ledger export / verify ----

def _ledger_source(args: argparse.Namespace) -> tuple[Any, Any, str]:
    """(snapshot, rollbacks, source) of a ledger FILE, or of a cluster EffectLedger NAME."""
    from ..undo.sources import SourceError, read_ledger_file, snapshot

    path = Path(args.ledger)
    if path.is_file():
        snap = read_ledger_file(path)
        frozen = path.with_name(f"{snap.run}.rollback.json")
        try:
            rollbacks = json.loads(frozen.read_text(encoding="utf-8")).get("rollbacks")
        except FileNotFoundError:
            rollbacks = None
        except (OSError, ValueError, AttributeError) as exc:
            raise SourceError(f"{frozen}: cannot be read ({exc})") from None
        return snap, rollbacks, str(path)
    from .kubectl import Kubectl, KubectlError

    name = args.ledger.split("/", 1)[1] if "/" in args.ledger else args.ledger
    try:
        kube = Kubectl.from_args(args)
        first = kube.get("effectledger", name)
        snap = snapshot([first], f"effectledger/{name}", lambda n: kube.get("effectledger", n))
    except KubectlError as exc:
        raise SourceError(f"{args.ledger} is not a file, and the cluster's EffectLedger "
                          f"{name} cannot be read: {exc}") from None
    # The operator keeps what its rollbacks ran in the first page's status.rollback.
    rollbacks = (first.get("status") or {}).get("rollback")
    return snap, rollbacks, f"effectledger/{name} in {kube.where}"


def cmd_ledger_export(args: argparse.Namespace) -> int:
    from ..ledger.entry import stamp
    from ..registry.errors import RegistryError
    from ..registry.signing import key_id, load_private_key
    from ..undo.evidence import build, signed
    from ..undo.sources import SourceError

    out = _export_file(args)
    if out is None:
        return 2
    try:
        key = load_private_key(args.key)
        snap, rollbacks, source = _ledger_source(args)
    except RegistryError as exc:
        return fail(args, "bad_key", str(exc))
    except SourceError as exc:
        return fail(args, "ledger", str(exc))
    evidence = build(snap, rollbacks, stamp(), source)
    document = signed(evidence, key)
    text = json.dumps(document, ensure_ascii=False, indent=1) + "\n"
    if out == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(out).write_text(text, encoding="utf-8")
        except OSError as exc:
            return fail(args, "write", f"cannot write {out}: {exc.strerror or exc}")
    print(f"wrote {'standard output' if out == '-' else out}: ledger {snap.name}, {plural(len(evidence['entries']), 'entry', 'entries')}, "
          f"{plural(len(evidence['approvals']), 'approval')}, {plural(len(evidence['steps']), 'undo step')}; signed "
          f"by key {key_id(key.public_key())}", file=sys.stderr if out == "-" else sys.stdout)
    return 0


def _export_file(args: argparse.Namespace) -> str | None:
    """Where `ledger export` writes: --file, else the deprecated -o/--out (with a note);
    None after a usage error."""
    if args.file and args.out:
        print("error: give --file FILE only (-o/--out is its deprecated spelling)", file=sys.stderr)
        return None
    if args.out:
        if args.out in ("json", "yaml", "text"):
            print(f"error: -o {args.out}: ledger export always writes signed JSON; name the file with "
                  "--file FILE (- for standard output)", file=sys.stderr)
            return None
        print("note: -o/--out FILE is deprecated for ledger export: use --file FILE (-o names an "
              "output format in the other commands)", file=sys.stderr)
        return str(args.out)
    if not args.file:
        print("error: say where to write the evidence: --file FILE (- for standard output)", file=sys.stderr)
        return None
    return str(args.file)


def cmd_ledger_verify(args: argparse.Namespace) -> int:
    from ..registry.errors import RegistryError
    from ..registry.signing import TrustStore
    from ..undo.evidence import EvidenceError, verify

    try:
        trust = TrustStore.from_files(args.trust)
    except RegistryError as exc:
        return fail(args, "bad_key", str(exc))
    try:
        document = json.loads(Path(args.file).read_text(encoding="utf-8"))
    except OSError as exc:
        return fail(args, "not_evidence", f"cannot read {args.file}: {exc.strerror or exc}")
    except ValueError as exc:
        return fail(args, "not_evidence", f"{args.file} is not JSON ({exc})")
    try:
        evidence = verify(document, trust)
    except EvidenceError as exc:
        return fail(args, exc.code, f"{args.file}: {exc.code}: {exc.message}")
    print(f"ok: evidence of ledger {evidence.get('ledger')} ({plural(len(evidence.get('entries') or []), 'entry', 'entries')}"
          f"), exported {evidence.get('exported')}, signed by key "
          f"{document['signature']['key_id']}")
    return 0


# ---- registration ----

def _plan_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", metavar="ledger/NAME", help="a ledger in the cluster "
                   "(kubectl unwind ...): read with kubectl, with the versions the cluster records")
    p.add_argument("--ledger", metavar="FILE", help="a ledger file: "
                   "<ledger-dir>/<run>.json of the local gateway, or `kubectl get effectledger "
                   "NAME -o json` saved (its pages are read too)")
    p.add_argument("-m", "--manifests", nargs="+", metavar="PATH",
                   help="today's manifests (files or folders, one set; local ledgers)")
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
    from .kubectl import add_kube_flags

    p = sub.add_parser("plan", help="show what a rollback of a run would do (calls nothing)",
                       description="The undo plan of a run's ledger: each entry's step in "
                       "execution order, with the undo tool, residue, approval and why. "
                       "See docs/rollback.md.")
    _plan_flags(p)
    add_output_flags(p)  # -o json|yaml: the plan as one document
    add_kube_flags(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("rollback", help="roll a run back: ledger/NAME in the cluster (the operator "
                       "runs one Job per step), or a local ledger file", description="ledger/NAME: ask "
                       "the operator to roll the run back (--reason, --watch). --ledger FILE: show the "
                       "plan, ask (unless --yes), run its steps and record each in the ledger file; run "
                       "again to resume. See docs/rollback.md.")
    _plan_flags(p)
    p.add_argument("--yes", action="store_true", help="run without asking (the plan is "
                   "printed first all the same)")
    p.add_argument("--rewrite-upstream", action="append", metavar="FROM=TO", help="call TO instead of "
                   "an upstream URL that starts with FROM, as the local gateway's flag of that name")
    p.add_argument("--by", metavar="NAME", help="who runs (and so approves) the rollback, "
                   "recorded in each entry (default UNWIND_ACTOR, else local:<user>)")
    p.add_argument("--secrets-dir", metavar="DIR", help="secrets as DIR/<name>/<key> files "
                   "(the environment's UNWIND_SECRET_<NAME>_<KEY> is read too)")
    cluster = p.add_argument_group("a ledger in the cluster (ledger/NAME)")
    cluster.add_argument("--reason", metavar="TEXT", help="why (required): recorded in spec.rollback")
    cluster.add_argument("--watch", action="store_true", help="follow the steps until the ledger "
                         "is RolledBack (exit 0) or Degraded (exit 1)")
    cluster.add_argument("--timeout", default="10m", help="how long --watch follows (default 10m)")
    add_kube_flags(p)
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

    ledger = sub.add_parser("ledger", help="signed evidence of a run: export and verify")
    lsub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")
    p = lsub.add_parser("export", help="write a signed JSON evidence file of a run",
                        description="Entries, approvals with identities, the plans its "
                        "rollbacks ran and every step's outcome, signed with Ed25519. LEDGER is "
                        "a ledger file, or the name of an EffectLedger in the cluster (read "
                        "with kubectl).")
    p.add_argument("ledger", metavar="NAME|FILE")
    p.add_argument("--key", required=True, metavar="KEY", help="the Ed25519 private key "
                   "(`unwind keygen PATH` makes PATH.key)")
    p.add_argument("-f", "--file", metavar="FILE", help="the evidence file to write (- for standard "
                   "output)")
    # deprecated: -o names an output format in every other command
    p.add_argument("-o", "--out", dest="out", metavar="FILE", help=argparse.SUPPRESS)
    add_kube_flags(p)
    p.set_defaults(func=cmd_ledger_export)
    p = lsub.add_parser("verify", help="check an evidence file's digest and signature",
                        description="Exit 0 when the evidence is intact and signed by a trusted "
                        "key; else exit 1 with the code: not_evidence, digest_mismatch, "
                        "unsigned, untrusted, bad_signature.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--trust", required=True, nargs="+", metavar="KEY", help="trusted public "
                   "key files (PEM; `unwind keygen` makes PATH.pub)")
    p.set_defaults(func=cmd_ledger_verify)
