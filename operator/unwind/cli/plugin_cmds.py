"""`unwind approve|deny|history|diff|status`: the kubectl plugin (`kubectl unwind ...`).

Thin commands: read objects through kubectl (kubectl.py), shape them with the pure
plugin_view.py, print. A decision is an Approval object; the admission webhook stamps who
made it and refuses what it must (four-eyes, a stale checksum, forged annotations), and the
operator tallies it. The plugin only fills in the exact version (checksum) being decided,
so a person never copies a hash by hand.

`plan` and `rollback` of ledger/NAME (cmd_cluster_plan, cmd_cluster_rollback) are here too:
rollback_cmds.py parses `unwind plan|rollback` and hands a ledger in the cluster over to
them; the selection flags and the plan's table are shared through plans.py.
"""

from __future__ import annotations

import argparse
import functools
import json
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import API_GROUP, API_VERSION
from ..bundle import BUNDLE_NAME
from ..manifest.durations import parse_duration
from ..operator.identity import APPROVER
from ..operator.reconcile import Reason
from ..operator.undojob import label_value
from . import plugin_view as view
from .kubectl import Kubectl, KubectlError, add_kube_flags
from .output import emit, output_format
from .plans import format_plan, parse_now, parse_selection, show_plan
from .plugin_view import Target, UsageError

COMMANDS = ("approve", "deny", "history", "diff", "status")
POLL_SECONDS = 1.0


class Refusal(Exception):
    """The command cannot go on; the message says why and what to do."""


def _guarded(error_code: int = 1) -> Callable[[Callable[[argparse.Namespace], int]],
                                              Callable[[argparse.Namespace], int]]:
    """Print refusals and kubectl errors as one `error:` line with the command's error code."""
    def wrap(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
        @functools.wraps(func)
        def run(args: argparse.Namespace) -> int:
            try:
                return func(args)
            except (Refusal, UsageError, KubectlError) as exc:
                print(f"error: {exc}", file=sys.stderr)
                return error_code
        return run
    return wrap


def _note(text: str) -> None:
    print(f"note: {text}", file=sys.stderr)


def _read(k: Kubectl, target: Target) -> dict[str, Any]:
    try:
        obj = k.get(target.resource, target.name)
    except KubectlError as exc:
        if exc.reason == "NotFound":
            raise Refusal(f"{target} does not exist in {k.where}") from None
        raise
    if not isinstance(obj, dict):
        raise Refusal(f"kubectl did not return {target} as an object")
    return obj


def _approvals(k: Kubectl) -> list[dict[str, Any]]:
    return k.items(f"approvals.{API_GROUP}")


# ---- approve / deny -------------------------------------------------------------------

def _current_version(target: Target, obj: dict[str, Any], decision: str) -> tuple[str, int]:
    """The checksum and version being decided: the current spec, once the operator has
    seen it and found it valid."""
    if not view.status(obj):
        raise Refusal(f"{target}: the operator has not reported on it yet (is the Unwind operator "
                      "running?); try again")
    if not view.settled(obj):
        raise Refusal(f"{target}: the operator has not seen the latest spec yet; try again")
    valid = view.conditions(obj).get("Valid", {})
    st = view.status(obj)
    if valid.get("status") != "True" or not st.get("checksum") or st.get("version") is None:
        raise Refusal(f"{target} is invalid, so there is nothing to {decision}: "
                      f"{valid.get('message') or 'see its Valid condition'}; fix the spec first")
    return str(st["checksum"]), int(st["version"])


def _create(k: Kubectl, body: dict[str, Any], name: Callable[[], str]) -> dict[str, Any]:
    """Create the Approval; a name taken already (random, so hardly ever) gets a new one."""
    for _ in range(3):
        body["metadata"]["name"] = name()
        try:
            return k.create(body)
        except KubectlError as exc:
            if exc.reason != "AlreadyExists":
                raise
    raise Refusal("could not find a free Approval name after 3 tries")


def _approval_body(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "Approval", "metadata": {}, "spec": spec}


def _result(created: dict[str, Any], target: dict[str, Any],
            condition: dict[str, Any] | None = None) -> dict[str, Any]:
    ann, spec = view.annotations_of(created), created.get("spec") or {}
    try:
        groups = json.loads(ann.get(APPROVER.groups) or "[]")
    except ValueError:
        groups = []
    return {"namespace": view.meta(created).get("namespace"), "approval": view.meta(created).get("name"),
            "decision": spec.get("decision"), "approver": ann.get(APPROVER.user),
            "approverGroups": groups, "reason": spec.get("reason"), "target": target,
            "condition": condition}


@_guarded()
def cmd_decide(args: argparse.Namespace) -> int:
    targets = list(dict.fromkeys(args.target or ()))  # the same manifest twice is decided once
    if args.ledger:  # the local form: a ledger file, no cluster
        if targets:
            raise UsageError(f"--ledger decides on a ledger file's entry: drop {' '.join(targets)}")
        from .gateway_cmds import cmd_local_decide

        return cmd_local_decide(args)
    if args.by or args.group or args.deny:
        raise UsageError("--by, --group and --deny are for local ledgers (--ledger FILE); in a "
                         "cluster your identity comes from your credentials")
    if not targets:
        raise UsageError("say what to decide: tm/NAME (one or more) or ledger/NAME (or --ledger FILE)")
    decision = args.command
    parsed = [view.parse_target(t) for t in targets]
    target = parsed[0]
    if len(parsed) > 1 and any(t.kind == "EffectLedger" for t in parsed):
        raise UsageError("several targets are for ToolManifests (tm/A tm/B ...); decide on one "
                         "ledger entry per command: ledger/NAME --entry ID")
    if target.kind == "ToolManifest" and args.entry:
        raise UsageError("--entry names a ledger entry: use it with ledger/NAME")
    if target.kind == "EffectLedger" and not args.entry:
        raise UsageError(f"{target}: say which entry with --entry ID")
    if target.kind == "EffectLedger" and args.wait:
        raise UsageError("--wait follows a ToolManifest's Approved condition; a ledger entry's "
                         f"tally is in its approval: `kubectl get {target}{view.ns_flag(args.namespace)} -o yaml`")
    timeout = _timeout(args.timeout)
    k = Kubectl.from_args(args)
    if target.kind == "EffectLedger":
        return _decide_entry(k, target, decision, args)
    if len(parsed) == 1:
        ok, doc = _decide_manifest(k, target, decision, args, timeout)
        if args.output:
            emit(doc, args.output)
        return 0 if ok else 1
    return _decide_manifests(k, parsed, decision, args, timeout)


def _decide_manifests(k: Kubectl, targets: Sequence[Target], decision: str, args: argparse.Namespace,
                      timeout: float) -> int:
    """Several ToolManifests in one command (a release of a set): each gets its own Approval
    of its own current version, as if decided one by one; one refused (invalid, not seen yet,
    four-eyes) is reported and the others are still decided. Exit 1 when any was refused."""
    docs: list[dict[str, Any]] = []
    refused: list[str] = []
    for target in targets:
        try:
            ok, doc = _decide_manifest(k, target, decision, args, timeout)
        except (Refusal, KubectlError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            ok, doc = False, {"target": {"toolManifest": target.name}, "error": str(exc)}
        docs.append(doc)
        if not ok:
            refused.append(str(target))
    if args.output:
        emit(docs, args.output)
    else:
        done = len(targets) - len(refused)
        print(f"{'approved' if decision == 'approve' else 'denied'} {done} of {len(targets)} manifests"
              + (f"; not decided: {', '.join(refused)} (see the errors above)" if refused else ""))
    return 1 if refused else 0


def _timeout(text: str) -> float:
    if text.strip().isdigit():
        raise UsageError(f"--timeout {text}: give a unit, e.g. 60s or 5m")
    try:
        return parse_duration(text) / 1000
    except ValueError as exc:
        raise UsageError(f"--timeout: {exc}") from None


def _decide_manifest(k: Kubectl, target: Target, decision: str, args: argparse.Namespace,
                     timeout: float) -> tuple[bool, dict[str, Any]]:
    """Decide on one ToolManifest's current version: (whether it went as decided, the -o document)."""
    obj = _read(k, target)
    digest, version = _current_version(target, obj, decision)
    approved = view.conditions(obj).get("Approved", {})
    if decision == "approve" and approved.get("reason") == Reason.DENIED:
        _note(f"{approved.get('message')}; your approval is recorded but does not count")
    spec: dict[str, Any] = {"target": {"toolManifest": target.name, "checksum": digest}, "decision": decision}
    if args.reason:
        spec["reason"] = args.reason
    created = _create(k, _approval_body(spec), lambda: view.approval_name(
        target.name, decision, f"v{version}", secrets.token_hex(4)))
    name, who = view.meta(created).get("name"), view.annotations_of(created).get(APPROVER.user, "?")
    what = f"version {version} of {target} (sha256:{view.short(digest)}…)"
    _note_already_decided(k, created, what)
    if decision == "deny":
        tail = "a deny is final for this version: only a new spec can be approved"
    elif view.status(obj).get("publishedChecksum") == digest:
        tail = "this version is already enforced; your approval is on record"
    else:
        tail = "it will be enforced once the operator tallies it"
    summary = {"toolManifest": target.name, "checksum": digest, "version": version}
    if not args.output:
        print(f"{'approved' if decision == 'approve' else 'denied'} {what} as {who} (Approval {name}); {tail}")
    condition, ok = None, True
    if args.wait:
        condition, ok, why = _wait(k, target, digest, decision, str(name), timeout)
        if not args.output:
            print(f"Approved={condition.get('status')} ({condition.get('reason')}): {condition.get('message')}")
        if not ok:
            print(f"error: {why}", file=sys.stderr)
    return ok, _result(created, summary, condition)


def _wait(k: Kubectl, target: Target, digest: str, decision: str, name: str,
          timeout: float) -> tuple[dict[str, Any], bool, str]:
    """Poll the ToolManifest until its Approved condition reflects the decision:
    (the condition, whether it went the way decided, why not)."""
    deadline = time.monotonic() + timeout
    condition: dict[str, Any] = {}
    while True:
        obj = _read(k, target)
        if view.settled(obj):
            st = view.status(obj)
            condition = dict(view.conditions(obj).get("Approved", {}))
            if st.get("checksum") != digest:
                return condition, False, (f"the spec of {target} changed meanwhile (now version "
                                          f"{st.get('version')}): decide on the new version")
            reason, message = condition.get("reason"), str(condition.get("message") or "")
            if decision == "deny" and reason == Reason.DENIED:
                return condition, True, ""
            if decision == "approve":
                if condition.get("status") == "True":
                    return condition, True, ""
                if reason == Reason.DENIED:
                    return condition, False, "the version was denied: a deny is final"
                if "not counted" in message and f"Approval {name}" in message.split("not counted", 1)[1]:
                    return condition, False, "the operator did not count your approval (see the message)"
        if time.monotonic() >= deadline:
            return condition, False, (f"timed out after {timeout:g}s waiting for the operator to "
                                      "tally the decision (is the operator running?)")
        time.sleep(POLL_SECONDS)


def _decide_entry(k: Kubectl, target: Target, decision: str, args: argparse.Namespace) -> int:
    ledger = _read(k, target)  # a clear "does not exist" before the webhook's
    spec: dict[str, Any] = {"target": {"effectLedger": target.name, "entry": args.entry}, "decision": decision}
    # Bind the decision to the arguments the entry holds now: it never counts for others.
    entries = (ledger.get("status") or {}).get("entries") or []
    digest = next((e.get("arguments_sha256") for e in entries
                   if isinstance(e, dict) and e.get("id") == args.entry), None)
    if isinstance(digest, str) and digest:
        spec["target"]["argumentsSha256"] = digest
    if args.reason:
        spec["reason"] = args.reason
    created = _create(k, _approval_body(spec), lambda: view.approval_name(
        target.name, decision, args.entry, secrets.token_hex(4)))
    if args.output:
        emit(_result(created, {"effectLedger": target.name, "entry": args.entry}), args.output)
        return 0
    name, who = view.meta(created).get("name"), view.annotations_of(created).get(APPROVER.user, "?")
    _note_already_decided(k, created, f"entry {args.entry} of {target}")
    print(f"{'approved' if decision == 'approve' else 'denied'} entry {args.entry} of {target} as {who} "
          f"(Approval {name}); the operator tallies it into the entry (its approval in `kubectl get "
          f"{target}{view.ns_flag(k.namespace)} -o yaml`), and the agent's retry of the call runs it once approved")
    return 0


def _note_already_decided(k: Kubectl, created: dict[str, Any], what: str) -> None:
    """Say so when the same person made the same decision on the same thing before."""
    try:
        earlier = view.already_decided(created, _approvals(k), APPROVER.user)
    except KubectlError:
        return  # an approver who may create Approvals but not list them: nothing to compare
    if earlier is not None:
        spec = view.part(created, "spec")
        _note(f"already decided: {view.annotations_of(created).get(APPROVER.user)} made the same "
              f"decision ({spec.get('decision')}) on {what} in Approval {view.meta(earlier).get('name')}; "
              "this one is recorded but changes nothing")


# ---- history / diff / status ----------------------------------------------------------

def _enforced(k: Kubectl, obj: dict[str, Any]) -> view.Enforced | None:
    """The version the namespace bundle holds. Reading the bundle needs ConfigMap access,
    which approvers often lack: then the operator's report in the status stands in."""
    try:
        cm = k.get("configmap", BUNDLE_NAME)
    except KubectlError as exc:
        if exc.reason == "NotFound":
            return None
        if exc.reason != "Forbidden":
            raise
        _note(f"you may not read ConfigMap {BUNDLE_NAME}: what is enforced and its signer are "
              "taken from the ToolManifest's status")
        return view.enforced_from_status(obj)
    return view.enforced_from_index(view.bundle_index(cm), view.meta(obj).get("name", ""))


def _revisions(k: Kubectl, obj: dict[str, Any]) -> list[dict[str, Any]]:
    return k.items("controllerrevisions", "-l", f"{view.OWNER_LABEL}={view.meta(obj).get('uid')}")


@_guarded()
def cmd_history(args: argparse.Namespace) -> int:
    target = view.parse_target(args.target, ("ToolManifest",))
    k = Kubectl.from_args(args)
    obj = _read(k, target)
    rows = view.history(obj, _revisions(k, obj), _approvals(k), _enforced(k, obj))
    _print_rows(rows, view.HISTORY_HEADERS, f"{target} has no versions yet: no valid spec has "
                "been recorded", args.output)
    return 0


@_guarded(error_code=2)
def cmd_diff(args: argparse.Namespace) -> int:
    target = view.parse_target(args.target, ("ToolManifest",))
    a, b = view.parse_version(args.a), view.parse_version(args.b)
    k = Kubectl.from_args(args)
    obj = _read(k, target)
    revisions = _revisions(k, obj)
    ra, rb = view.revision(obj, revisions, a), view.revision(obj, revisions, b)

    def label(version: int, r: Mapping[str, Any]) -> str:
        return f"{target} v{version} (sha256:{view.short(view.annotations_of(r).get(view.CHECKSUM_ANNOTATION))})"

    text = view.diff_text(label(a, ra), view.revision_data(ra), label(b, rb), view.revision_data(rb))
    if args.output:
        emit({"a": {"version": a, "manifest": view.revision_data(ra)},
               "b": {"version": b, "manifest": view.revision_data(rb)},
               "equal": not text, "diff": text}, args.output)
    else:
        sys.stdout.write(text)
    return 1 if text else 0


@_guarded()
def cmd_status(args: argparse.Namespace) -> int:
    k = Kubectl.from_args(args)
    try:
        approvals = _approvals(k)
    except KubectlError as exc:
        if exc.reason != "Forbidden":
            raise
        approvals = []  # only who denied is read from them; the rest is in the status
    if args.target:
        target = view.parse_target(args.target, ("ToolManifest",))
        detail = view.Detail(_read(k, target), approvals)
        if args.output:
            emit(detail.to_json(), args.output)
        else:
            print(detail.text())
        return 0
    rows = view.summaries(k.items(f"toolmanifests.{API_GROUP}"), approvals)
    _print_rows(rows, view.NAMESPACE_HEADERS, f"No ToolManifests in {k.where}.", args.output)
    return 0


def _print_rows(rows: Sequence[view.VersionRow | view.Summary], headers: Sequence[str],
                empty: str, output: str | None) -> None:
    """A listing: one document for -o json|yaml, else a table; ``empty`` on stderr when
    there is no row."""
    if output:
        emit([r.to_json() for r in rows], output)
    elif not rows:
        print(empty, file=sys.stderr)
    else:
        print(view.table(headers, (r.cells() for r in rows)))


# ---- plan / rollback (ledger/NAME: the cluster form of `unwind plan|rollback`) ---------

def _ledger_plan(k: Kubectl, target: Target, args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """The run's first page and its plan, made by the same planner as `unwind plan`, from
    the ledger's pages and the versions the cluster records."""
    from ..ledger.plan import PlanError, make_plan
    from ..undo.sources import SourceError, snapshot

    first = _read(k, target)
    if int(view.part(first, "spec").get("page") or 1) != 1:
        raise Refusal(f"{target} is a continuation page of run {view.part(first, 'spec').get('run')}: "
                      "name the run's first page")
    try:
        snap = snapshot([first], str(target), lambda name: k.get(RESOURCE_LEDGERS, name))
        versions = view.cluster_versions(k.items(f"toolmanifests.{API_GROUP}"),
                                         k.items("controllerrevisions", "-l", view.OWNER_LABEL),
                                         current=bool(getattr(args, "current", False)))
        plan = make_plan(snap.name, snap.entries, versions, now=parse_now(args),
                         selection=parse_selection(args), holders=_lease_holders(k, snap.run, snap.entries))
    except (SourceError, PlanError, ValueError) as exc:
        raise Refusal(str(exc)) from None
    return first, plan


RESOURCE_LEDGERS = f"effectledgers.{API_GROUP}"


def _lease_holders(k: Kubectl, run: str, entries: list[Any]) -> dict[str, Any] | None:
    """Who holds the key of each keyed pending entry (the gateways' Leases), as the
    operator's planner reads them; None when they cannot be read (the planner then asks the
    ledger alone)."""
    from ..ledger.clusterstore import lease_holder, lease_name
    from ..ledger.rollback_rules import keyed_pending

    out: dict[str, Any] = {}
    for entry_id, name in keyed_pending(run, entries).items():
        try:
            out[entry_id] = lease_holder(k.json("get", "lease", lease_name(name)))
        except KubectlError as exc:
            if exc.reason != "NotFound":
                return None
            out[entry_id] = None
    return out


@_guarded()
def cmd_cluster_plan(args: argparse.Namespace) -> int:
    target = view.parse_target(args.target, ("EffectLedger",))
    _, plan = _ledger_plan(Kubectl.from_args(args), target, args)
    show_plan(plan, output_format(args))
    return 0


@_guarded()
def cmd_cluster_rollback(args: argparse.Namespace) -> int:
    from ..ledger.entry import stamp

    target = view.parse_target(args.target, ("EffectLedger",))
    if not args.reason or not args.reason.strip():
        raise UsageError("say why with --reason TEXT: it is recorded with the rollback")
    timeout = _timeout(args.timeout)
    k = Kubectl.from_args(args)
    _, plan = _ledger_plan(k, target, args)
    sys.stdout.write(format_plan(plan))
    patch = view.rollback_request(args.reason, args.since, args.entry or (), stamp())
    try:
        patched = k.json("patch", RESOURCE_LEDGERS, target.name, "--type=merge", "-p", json.dumps(patch))
    except KubectlError as exc:
        if exc.reason == "NotFound":
            raise Refusal(f"{target} does not exist in {k.where}") from None
        raise
    generation = int(view.meta(patched).get("generation") or 0)
    print(f"rollback of {target} requested (generation {generation}): the operator freezes the "
          f"plan and runs one Job per step; follow it with `kubectl get jobs{view.ns_flag(k.namespace)} -l "
          f"unwind.dev/ledger={label_value(target.name)}`" + ("" if args.watch else " or --watch"))
    if not args.watch:
        return 0
    return _watch_rollback(k, target, generation, timeout)


def _watch_rollback(k: Kubectl, target: Target, generation: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    seen: dict[int, str] = {}
    planned = False
    waited: str | None = None
    stuck_said: str | None = None
    while True:
        obj = _read(k, target)
        waiting = view.waiting_line(obj, generation)
        if waiting is not None and waiting != waited:  # fenced: the calls in flight first
            print(waiting, flush=True)
            waited = waiting
        rb = view.status(obj).get("rollback")
        if isinstance(rb, Mapping) and int(rb.get("generation") or 0) >= generation:
            if not planned:
                print(view.planned_line(rb), flush=True)
                planned = True
            for line in view.step_lines(seen, rb):
                print(line, flush=True)
        stuck = view.stuck_line(obj, generation)
        if stuck is not None and stuck != stuck_said:  # a step that cannot start is not silent
            print(stuck, flush=True)
        stuck_said = stuck
        done = view.rollback_done(obj, generation)
        if done is not None:
            ok, why = done
            print(view.ended_line(str(target), ok, why), flush=True)
            return 0 if ok else 1
        if time.monotonic() >= deadline:
            print(view.watch_timeout(obj, str(target), generation, timeout), file=sys.stderr)
            return 1
        time.sleep(POLL_SECONDS)


# ---- registration ---------------------------------------------------------------------

def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", choices=("json", "yaml"), help="machine-readable output")
    add_kube_flags(p)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for verb, doc in (("approve", "approve the current version of a ToolManifest, or a ledger entry"),
                      ("deny", "deny the current version of a ToolManifest, or a ledger entry (final)")):
        p = sub.add_parser(verb, help=doc, description=doc + ". Your identity comes from your "
                           "credentials: the admission webhook records it.")
        p.add_argument("target", metavar="TARGET", nargs="*", help="tm/NAME (several: each is "
                       "decided on its own, e.g. a set released together) or ledger/NAME")
        p.add_argument("--entry", metavar="ID", help="the ledger entry to decide (ledger targets)")
        p.add_argument("--reason", metavar="TEXT", help="why, for whoever reads the record later")
        p.add_argument("--wait", action="store_true", help="wait until the Approved condition "
                       "reflects the decision, and print it")
        p.add_argument("--timeout", default="60s", help="how long --wait waits (default 60s)")
        local = p.add_argument_group("local ledgers (no cluster)")
        local.add_argument("--ledger", metavar="FILE", help="decide on an entry of this local "
                           "ledger file (<ledger-dir>/<run>.json) instead of a cluster object")
        local.add_argument("--by", metavar="NAME", help="who decides (self-declared)")
        local.add_argument("--group", action="append", metavar="G", help="a group the approver "
                           "holds (repeatable)")
        local.add_argument("--deny", action="store_true", help="deny instead of approve")
        _common(p)
        p.set_defaults(func=cmd_decide)

    p = sub.add_parser("history", help="a ToolManifest's versions: author, approvers, signer, enforced")
    p.add_argument("target", metavar="tm/NAME")
    _common(p)
    p.set_defaults(func=cmd_history)

    p = sub.add_parser("diff", help="what changed between two versions of a ToolManifest (exit 1 "
                       "when they differ, 2 on errors)")
    p.add_argument("target", metavar="tm/NAME")
    p.add_argument("a", metavar="A", help="a version: 2 or v2")
    p.add_argument("b", metavar="B", help="another version")
    _common(p)
    p.set_defaults(func=cmd_diff)

    p = sub.add_parser("status", help="one ToolManifest in detail, or the namespace at a glance")
    p.add_argument("target", metavar="tm/NAME", nargs="?")
    _common(p)
    p.set_defaults(func=cmd_status)
