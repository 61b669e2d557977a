"""Lint rules about what a rollback can rely on (issues 27 and 30); their ``Rule`` rows are in
``lint.RULES``.

- L043: a tool with a capture whose undo restores fields (``verification.expect``) and no
  read after the call (``verification.after_call``): the divergence check then compares the
  state before the undo with the call's *answer* at the expect paths. An answer that holds
  none of them (``{ok, id, rev}``, an MCP tool's prose) leaves no check at all, so a later
  change is overwritten; one that holds them in another form is refused as diverged although
  nothing changed.
- L044: ``idempotency.scope: run`` with an argument carrier: the run is not part of what the
  upstream sees (a header carrier gets ``<run>:<key>``, an argument is the caller's to
  match), so an upstream that replays by key answers a later run with an earlier run's
  effect, perhaps one a rollback undid.
- L045 (a note): a reversible or compensable tool that declares no ``lookup``: when its answer
  is lost (a timeout, a dropped connection), nothing can find out whether it acted, and a
  rollback leaves it ``unrecoverable``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .model import UNDOABLE

if TYPE_CHECKING:
    from .lint import Context


def l043_divergence_compares_with_the_answer(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        v = m.compensation.verification if m.compensation else None
        if m.capture is None or v is None or not v.expect or v.after_call:
            continue
        yield m.tool, "compensation.verification.after_call", (
            f"the undo of {m.tool} restores {', '.join(sorted(v.expect))}, and the check that "
            "nobody changed them since compares the state it reads with the call's answer at "
            "those paths: an answer that holds none of them ({ok, id, rev}, an MCP tool's "
            "prose) leaves no divergence check, one that holds them otherwise reads as "
            "diverged; set verification.after_call: true to compare with a read made right "
            "after the call")


def l044_run_key_shared_across_runs(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        idem = m.idempotency
        if idem is None or idem.scope != "run" or idem.carrier is None or not idem.carrier.argument:
            continue
        yield m.tool, "idempotency.carrier.argument", (
            f"scope run, but the upstream sees the key {idem.key!r} in argument "
            f"{idem.carrier.argument} without the run: every run sends the same key, and an "
            "upstream that replays by key answers a later run with an earlier run's effect "
            "(perhaps one a rollback undid); put the run's identity into the key template, "
            "or carry the key in a header (the gateway then sends <run>:<key>)")


def l045_no_lookup_for_a_lost_answer(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.effect not in UNDOABLE or m.lookup is not None or m.upstream is None:
            continue
        yield m.tool, "lookup", (
            f"{m.tool} declares no lookup: when its answer is lost (a timeout, a dropped "
            "connection) nothing can find out whether it acted, and a rollback leaves it "
            "unrecoverable; declare lookup: {tool: <a read_only tool>, by: idempotency_key "
            "| id, arguments: {...}} if the upstream can be asked")
