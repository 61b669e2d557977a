"""`unwind plan`, `unwind rollback`, `unwind undo-step` and `unwind ledger export|verify`
(`ledger list|show` are in ledger_cmds.py).

`plan` shows what a rollback of a run will do (pure: it calls nothing); `rollback` runs it
locally against a ledger file; `undo-step` runs one step (the Job's entry point in a
cluster); `ledger export` writes signed evidence of a run, `ledger verify` checks it.
See docs/rollback.md.

`plan` and `rollback` of ledger/NAME, a ledger in the cluster, are the kubectl plugin's
(plugin_cmds.py: cmd_cluster_plan, cmd_cluster_rollback); this module parses both forms'
flags and hands ledger/NAME over. What both forms share is in plans.py.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import ledger_cmds
from .output import add_output_flags, fail, output_format, plural
from .plans import format_plan, parse_now, parse_selection, show_plan

DEFAULT_TERMINATION_LOG = "/dev/termination-log"


# ---- plan and rollback: a ledger file here, ledger/NAME in the cluster ----

def cmd_plan(args: argparse.Namespace) -> int:
    return _file_or_cluster(args, "plan", _plan_file)


def cmd_rollback(args: argparse.Namespace) -> int:
    return _file_or_cluster(args, "rollback", _rollback_file)


def _file_or_cluster(args: argparse.Namespace, command: str,
                     on_file: Callable[[argparse.Namespace], int]) -> int:
    """Run ``command`` on a ledger file (``on_file``, below), or on ledger/NAME in the cluster:
    plugin_cmds.py's cmd_cluster_plan or cmd_cluster_rollback, imported only then. Neither
    form, or both, is a usage error."""
    try:
        if _in_cluster(args, command):
            from . import plugin_cmds

            if command == "plan":
                return plugin_cmds.cmd_cluster_plan(args)
            return plugin_cmds.cmd_cluster_rollback(args)
    except ValueError as exc:
        return fail(args, "usage", str(exc), 2)
    return on_file(args)


def _in_cluster(args: argparse.Namespace, command: str) -> bool:
    """True for ledger/NAME; False for a ledger file once the file form's required flags are
    there. ValueError: what is missing, or that both were given."""
    if args.target:
        if args.ledger:
            raise ValueError("give ledger/NAME or --ledger FILE, not both")
        return True
    missing = [f for f, v in (("--ledger FILE", args.ledger), ("-m MANIFESTS", args.manifests)) if not v]
    if missing:
        raise ValueError(f"{command} needs {' and '.join(missing)} (a local ledger), or ledger/NAME "
                         "for a ledger in the cluster")
    return False


def _plan_file(args: argparse.Namespace) -> int:
    from ..ledger.plan import PlanError, make_plan
    from ..undo.sources import SourceError, load_versions, read_ledger_file

    try:
        snap = read_ledger_file(args.ledger)
        versions = load_versions(args.manifests, args.versions or (), current=args.current)
        selection, moment = parse_selection(args), parse_now(args)
        plan = make_plan(snap.name, snap.entries, versions, now=moment, selection=selection,
                         holders=folder_holders(Path(args.ledger).parent, snap.run, snap.entries))
    except (SourceError, PlanError, ValueError) as exc:
        return fail(args, "plan", str(exc))
    show_plan(plan, output_format(args))
    return 0


def folder_holders(folder: Path, run: str, entries: list[Any]) -> dict[str, Any] | None:
    """Who holds the key of each keyed pending entry, from the lock files beside the ledger
    (as the local rollback reads them); None for a saved file with no lock folder beside it
    (the planner then asks the ledger alone)."""
    from ..ledger.filestore import FileLocks
    from ..ledger.ledger_dir import LOCKS
    from ..ledger.rollback_rules import keyed_pending

    wanted = keyed_pending(run, entries)
    if not wanted or not (folder / LOCKS).is_dir():
        return None
    try:
        locks = FileLocks(folder)
    except OSError:
        return None
    return {entry_id: locks.peek_sync(name) for entry_id, name in wanted.items()}


def _rollback_file(args: argparse.Namespace) -> int:
    from ..ledger.plan import PlanError
    from ..ledger.store import StoreUnavailable
    from ..manifest.rewrite import parse_rewrite
    from ..undo.local import execute, open_ledger, plan_local
    from ..undo.sources import SourceError, load_versions
    from ..upstream.secrets import LocalSecrets

    if args.watch:
        return fail(args, "usage", "--watch is for a cluster ledger (ledger/NAME)", 2)
    try:
        ledger = open_ledger(args.ledger)
        rewrite = [parse_rewrite(r) for r in args.rewrite_upstream or []]
        versions = load_versions(args.manifests, args.versions or (), current=args.current, rewrite=rewrite)
        selection = parse_selection(args)
        moment = parse_now(args) if args.now else None
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
                                      moment=moment, say=lambda text: print(text, flush=True),
                                      reason=args.reason))
    except (SourceError, PlanError, StoreUnavailable) as exc:
        return fail(args, "rollback", str(exc))
    if summary.stopped is not None:
        s = summary.stopped
        # a reason that has a first mismatch quotes it (undo/runner.py)
        print(f"error: stopped at entry {s['entry']} ({s['outcome']}): {s['reason']}; the steps "
              "after it did not run: fix the cause and run the rollback again", file=sys.stderr)
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
    from ..gateway import tracing
    from ..undo.runner import fit, parse_step, run_step
    from ..upstream.client import Upstream
    from ..upstream.secrets import LocalSecrets

    async def run(spec: Any) -> dict[str, Any]:
        # in a Job of a traced call: the undo continues its trace (gateway/tracing.py)
        close = tracing.configure("unwind-undo-step") if os.environ.get("TRACEPARENT") else None
        upstream = Upstream()
        if close is not None:
            tracing.instrument_upstream(upstream)
        try:
            with tracing.step(spec.manifest.tool, spec.step.action, spec.step.entry,
                              os.environ.get("TRACEPARENT")):
                return await run_step(spec, upstream, LocalSecrets(
                    args.secrets_dir or os.environ.get("UNWIND_SECRETS_DIR")))
        finally:
            await upstream.aclose()
            if close is not None:
                await close()  # flushes the spans before the pod ends
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

def _ledger_source(args: argparse.Namespace) -> tuple[Any, Any, str, int]:
    """(snapshot, rollbacks, source, rollbacks dropped) of a ledger FILE, or of a cluster
    EffectLedger NAME."""
    from ..undo.sources import SourceError, read_ledger_file, snapshot

    path = Path(args.ledger)
    if path.is_file():
        snap = read_ledger_file(path)
        frozen = path.with_name(f"{snap.run}.rollback.json")
        try:
            kept = json.loads(frozen.read_text(encoding="utf-8"))
            rollbacks, dropped = kept.get("rollbacks"), int(kept.get("dropped") or 0)
        except FileNotFoundError:
            rollbacks, dropped = None, 0
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            raise SourceError(f"{frozen}: cannot be read ({exc})") from None
        return snap, rollbacks, str(path), dropped
    from .kubectl import Kubectl, KubectlError

    name = args.ledger.split("/", 1)[1] if "/" in args.ledger else args.ledger
    try:
        kube = Kubectl.from_args(args)
        first = kube.get("effectledger", name)
        snap = snapshot([first], f"effectledger/{name}", lambda n: kube.get("effectledger", n))
    except KubectlError as exc:
        raise SourceError(f"{args.ledger} is not a file, and the cluster's EffectLedger "
                          f"{name} cannot be read: {exc}") from None
    status = first.get("status") or {}
    return (snap, cluster_rollbacks(status), f"effectledger/{name} in {kube.where}",
            int(status.get("rollbacksDropped") or 0))


def cluster_rollbacks(status: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rollback request the first page keeps (``status.rollbacks``, oldest first), the
    one being run with its whole frozen plan (``status.rollback``) as ``plan``; None when no
    rollback was asked for. A ledger from before the audit trail has only the latest."""
    history = [dict(r) for r in status.get("rollbacks") or [] if isinstance(r, dict)]
    latest = status.get("rollback")
    if isinstance(latest, dict):
        mine = next((r for r in history if r.get("generation") == latest.get("generation")), None)
        if mine is None:
            history.append({"generation": latest.get("generation"), "plan": latest})
        else:
            mine["plan"] = latest
    return history or None


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
        snap, rollbacks, source, dropped = _ledger_source(args)
    except RegistryError as exc:
        return fail(args, "bad_key", str(exc))
    except SourceError as exc:
        return fail(args, "ledger", str(exc))
    evidence = build(snap, rollbacks, stamp(), source, dropped)
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

    ledger = sub.add_parser("ledger", help="a run's ledger: list and show a local folder's "
                            "runs, export and verify signed evidence")
    lsub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="COMMAND")
    ledger_cmds.register(lsub)
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
