"""Argument schemas (``input_schema``): JSON Schema 2020-12, bounded.

A manifest's ``input_schema`` describes the call's arguments; the gateway serves it as the
tool's MCP ``inputSchema`` and checks every call's arguments against it at both doors
before anything is recorded. The checking is the ``jsonschema`` library's (the ecosystem's
reference implementation), with bounds, because a schema is read from a manifest or an
upstream and evaluated on every call:

- a manifest's schema is 2020-12 (a ``$schema`` naming another is refused, not followed);
  an MCP upstream's may also be 2019-09 or draft-07, each checked by its own validator;
- ``$ref`` / ``$dynamicRef`` point inside the schema only (``#...``), at something that
  is there: nothing is fetched;
- a schema is at most ``MAX_SCHEMA_BYTES`` as compact JSON and nests at most
  ``MAX_SCHEMA_DEPTH`` levels;
- the root is an object schema (``type: object``), as MCP requires of ``inputSchema``;
- ``format`` is an annotation (2020-12's default): not asserted;
- its references expand to at most ``schema_work.MAX_EXPANSION`` subschemas, its patterns
  are matched by RE2 (no backtracking), and one check takes at most a budget of steps
  (``schema_work``: the work of a check is bounded whatever the schema and the arguments);
- at most ``MAX_ERRORS`` problems are reported per call, each message cut at 200 characters.

Pure: no gateway, no I/O.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator, Sequence
from itertools import islice
from typing import Any

from .schema_work import (
    MAX_EXPANSION,
    MAX_STEPS,
    bounded,
    budgeted,
    expansion,
    pattern_problem,
    target,
)

DIALECT = "https://json-schema.org/draft/2020-12/schema"
# What an MCP upstream may list besides 2020-12 (zod-based servers write draft-07): each is
# evaluated by its own validator, all local to the library. A manifest writes 2020-12 only.
UPSTREAM_DIALECTS = (DIALECT, "https://json-schema.org/draft/2019-09/schema",
                     "http://json-schema.org/draft-07/schema")
MAX_SCHEMA_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 32
MAX_ERRORS = 3
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_$-]+")  # fullmatch


def field_path(root: str, parts: Sequence[Any]) -> str:
    """``arguments.items[0].name``; a key that is not plain is written ``["a b"]``."""
    out = root
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(str(part)):
            out += f".{part}"
        else:
            out += f"[{json.dumps(str(part), ensure_ascii=False)}]"
    return out


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_SCHEMA_DEPTH:  # past the bound: known too deep, stop walking
                stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                      else item))
    return deepest


def _keys(node: Any, keys: tuple[str, ...],
          path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    """Every value of one of ``keys`` with its path (the schema's depth is bounded first)."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in keys:
                yield (*path, key), key, value
            yield from _keys(value, keys, (*path, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _keys(value, keys, (*path, i))


def _refs(node: Any) -> Iterator[tuple[tuple[Any, ...], str, Any]]:
    """Every ``$ref`` / ``$dynamicRef`` / ``$schema`` value with its path."""
    return _keys(node, ("$ref", "$dynamicRef", "$schema"))


def _name(schema: dict[str, Any]) -> str:
    return {UPSTREAM_DIALECTS[1]: "2019-09", UPSTREAM_DIALECTS[2]: "draft-07"}.get(
        _dialect(schema.get("$schema")), "2020-12")


def _dialect(value: Any) -> str:
    return value.rstrip("#") if isinstance(value, str) else ""


def _validator_class(schema: dict[str, Any]) -> Any:
    from jsonschema import Draft7Validator, Draft201909Validator, Draft202012Validator

    return {UPSTREAM_DIALECTS[1]: Draft201909Validator, UPSTREAM_DIALECTS[2]: Draft7Validator}.get(
        _dialect(schema.get("$schema")), Draft202012Validator)


def _points_inside(schema: dict[str, Any], ref: str) -> bool:
    """Whether a ``#...`` reference names a part of ``schema`` (a JSON pointer or an anchor)."""
    return target(schema, ref) is not None


def _work_problems(schema: dict[str, Any], root: str) -> list[tuple[str, str]]:
    """What would make checking arguments against ``schema`` unbounded work: references that
    fan out, patterns that need backtracking."""
    size = expansion(schema)
    if size > MAX_EXPANSION:
        return [(root, f"its $refs expand to more than {MAX_EXPANSION} subschemas (definitions "
                 "that reference each other several times fan out): checking one call could "
                 "take minutes; reference each definition from fewer places, or inline less")]
    problems = []
    for path, key, value in _keys(schema, ("pattern", "patternProperties")):
        for pattern in (value if key == "patternProperties" and isinstance(value, dict)
                        else [value]):
            problem = pattern_problem(pattern)
            if problem is not None:
                problems.append((field_path(root, path), problem))
    return problems


def schema_problems(schema: Any, root: str = "input_schema",
                    dialects: tuple[str, ...] = (DIALECT,)) -> list[tuple[str, str]]:
    """Why ``schema`` cannot serve as an argument schema: ``(field path, message)`` pairs,
    empty when it can. ``dialects``: the ``$schema`` values accepted."""
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, dict):
        return [(root, "must be a JSON Schema object, e.g. {type: object, properties: {...}}")]
    try:
        size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        return [(root, f"is not JSON: {exc}")]
    if size > MAX_SCHEMA_BYTES:
        return [(root, f"is {size} bytes as JSON, more than the {MAX_SCHEMA_BYTES // 1024} KiB an "
                 "argument schema may have: describe the arguments, not every value")]
    if _depth(schema) > MAX_SCHEMA_DEPTH:
        return [(root, f"nests deeper than {MAX_SCHEMA_DEPTH} levels: use $defs and $ref")]
    problems: list[tuple[str, str]] = []
    nested_ids = any(path for path, _, _ in _keys(schema, ("$id",)))
    for path, key, value in _refs(schema):
        where = field_path(root, path)
        if key == "$schema":
            if path != ("$schema",) or _dialect(value) not in dialects:
                problems.append((where, f"{value!r}: argument schemas are read as JSON Schema "
                                 f"2020-12 only; remove $schema or write {DIALECT}"
                                 if dialects == (DIALECT,) else
                                 f"{value!r} is not a dialect the gateway checks"))
        elif not isinstance(value, str) or not value.startswith("#"):
            problems.append((where, f"{value!r} points outside the schema: write references "
                             "as #/$defs/<name> (the gateway fetches no schema)"))
        elif not nested_ids and not _points_inside(schema, value):
            problems.append((where, f"{value!r} points to nothing in the schema: add what it "
                             "names (under $defs) or fix the reference"))
    if problems:
        return problems
    problems = _work_problems(schema, root)
    if problems:
        return problems
    try:
        _validator_class(schema).check_schema(schema)
    except SchemaError as exc:
        return [(field_path(root, list(exc.absolute_path)),
                 f"is not valid JSON Schema {_name(schema)}: {_cut(exc.message)}")]
    if schema.get("type") != "object":
        return [(f"{root}.type", "the arguments are an object: write type: object (MCP requires "
                 "an object schema)")]
    return []


@functools.lru_cache(maxsize=512)
def _compiled(text: str) -> Any:
    from referencing import Registry

    # An empty registry that retrieves nothing: a $ref that escapes the schema fails
    # (Unresolvable) instead of reaching the network or the disk.
    schema = json.loads(text)
    return bounded(_validator_class(schema))(schema, registry=Registry())


_by_object: dict[int, tuple[dict[str, Any], Any]] = {}


def compiled(schema: dict[str, Any]) -> Any:
    """The validator of a schema that passed ``schema_problems``: cached by the schema
    object (a manifest's, never changed in place; the object is kept, so its id stays its
    own), else by content. Hashing the content on every call cost 15 µs."""
    known = _by_object.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]
    validator = _compiled(json.dumps(schema, sort_keys=True, separators=(",", ":"),
                                     ensure_ascii=False))
    if len(_by_object) > 512:
        _by_object.clear()
    _by_object[id(schema)] = (schema, validator)
    return validator


class SchemaUnusable(Exception):
    """The schema cannot be evaluated on these arguments (a $ref loop, an unresolvable
    reference): the manifest's fault, not the caller's."""


def argument_problems(schema: dict[str, Any], arguments: Any, root: str = "arguments", *,
                      steps: int = MAX_STEPS,
                      deadline: float | None = None) -> list[tuple[str, str]]:
    """The arguments' problems against ``schema``: ``(field path, message)`` pairs, at most
    ``MAX_ERRORS``, the shallowest first; empty when they conform. ``TooMuchWork`` past
    ``steps`` keyword applications or the ``deadline`` (a ``time.monotonic()``)."""
    from jsonschema.exceptions import ValidationError
    from referencing.exceptions import Unresolvable

    validator = compiled(schema)
    try:
        errors: list[ValidationError] = budgeted(
            steps, deadline, lambda: list(islice(validator.iter_errors(arguments), 32)))
    except RecursionError:
        raise SchemaUnusable("the schema recurses without end on these arguments (a $ref "
                             "loop?)") from None
    except Unresolvable as exc:
        raise SchemaUnusable(f"a reference cannot be resolved: {_cut(str(exc))}") from None
    errors.sort(key=lambda e: (len(e.absolute_path), [str(p) for p in e.absolute_path]))
    out = []
    for error in errors[:MAX_ERRORS]:
        parts = list(error.absolute_path)
        missing = _missing_property(error)
        if missing is not None:
            parts.append(missing)
        out.append((field_path(root, parts), _cut(error.message)))
    return out


def _missing_property(error: Any) -> str | None:
    """The property a ``required`` error names (the path then ends at it)."""
    if error.validator != "required" or not isinstance(error.instance, dict):
        return None
    for name in error.validator_value or ():
        if isinstance(name, str) and name not in error.instance \
                and error.message.startswith(repr(name)):
            return name
    return None


def _cut(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 1] + "…"
