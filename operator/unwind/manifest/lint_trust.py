"""Lint rules about what a call is trusted to say (issue 29, items 2 and 5); their ``Rule``
rows are in ``lint.RULES``.

- L041: a mutating tool whose input schema admits arguments it does not name. The gateway
  refuses undeclared arguments where a schema lists ``properties`` (``declared.py``); an
  object left open (``additionalProperties``, no properties listed) lets the agent send
  fields nobody reviewed, which a rollback does not restore. No schema at all is not
  judged here (``unwind init``'s starters have none; the gateway checks nothing then).
- L042: an undo that names what to take back by projecting the call's own arguments
  (``entityNames: $args.entities[*].name``): a batch create that skips the items that
  exist (server-memory's ``create_entities`` does) would have its rollback delete them.
  What the call created is in its answer: ``$result[*].name``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .declared import open_places
from .model import Effect
from .refs import EACH, RefSyntaxError, parse_ref

if TYPE_CHECKING:
    from .lint import Context


def l041_open_input_schema(ctx: Context) -> Iterator[tuple[str, str, str]]:
    from .lint import input_schema_of

    for m in ctx.manifests:
        schema = input_schema_of(ctx, m)
        if m.effect == Effect.read_only or not isinstance(schema, dict):
            continue
        where = "input_schema" if m.input_schema is not None else "upstream"
        for place in open_places(schema):
            yield m.tool, where, (
                f"{place}: {m.tool} changes things, and its schema lets a call send fields "
                "nobody reviewed (the gateway refuses only arguments a closed object does not "
                "list; an undo restores none of the others): list them under properties, or "
                "set additionalProperties: false")
            break  # one finding per tool: the first place says what to do


def _projects_args(raw: Any) -> bool:
    try:
        ref = parse_ref(raw)
    except RefSyntaxError:
        return False
    return ref.root == "args" and any(seg is EACH for seg in ref.path)


def l042_batch_undone_by_the_callers_names(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        c = m.compensation
        if c is None or m.effect not in (Effect.compensable, Effect.reversible):
            continue
        for name, raw in c.argument_map.items():
            if _projects_args(raw):
                yield m.tool, f"compensation.argument_map.{name}", (
                    f"{raw} undoes what the call named, not what it made: if {m.tool} skips "
                    "items that already exist, the rollback takes those back too; map what "
                    "the answer says was created ($result[*]...), or declare that the call "
                    "fails on an existing item (ignore-check.unwind.dev/L042)")
