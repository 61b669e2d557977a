"""How much work an argument schema may cost (issue 29, item 4).

A schema comes from a manifest or from an MCP upstream's ``tools/list``, the arguments from
an agent; both may be hostile. Before, a 2 KiB schema whose ``$defs`` fanned out through
``$ref`` froze the gateway (``/healthz`` included) on one call, and so did a backtracking
``pattern`` on an agent's string. The bounds, each where it is cheapest:

- **at load**: ``expansion`` counts the subschemas a schema has once its references are
  followed (each reference target counted once per use, a reference back into a cycle
  counted once); past ``MAX_EXPANSION`` the schema is refused (``schema_problems``), for a
  manifest's ``input_schema`` and for a schema an upstream lists (that one is then served
  as listed and not checked, as any schema the gateway cannot check). ``pattern_problem``
  refuses a ``pattern`` or ``patternProperties`` key that RE2 cannot compile.
- **patterns** are matched by RE2 (``google-re2``), which runs in time linear in the text:
  no backtracking, whatever the pattern. RE2 has no lookaround and no backreferences;
  such patterns are refused at load.
- **evaluation** counts its steps: every keyword applied costs one, and the keywords whose
  own work grows with their input cost that (``enum`` its length, ``uniqueItems`` and the
  ``unevaluated*`` keywords the instance's, ``patternProperties`` patterns × keys).
  ``uniqueItems`` is linear here (the library's is quadratic on objects). Past the budget,
  or past a deadline, ``TooMuchWork`` is raised: the work of one check is bounded whatever
  the schema and the arguments. The gateway runs a check on the event loop with a small
  budget and, when that is not enough, again off the loop with the full one
  (``gateway/schemas.py``), so ``/healthz`` keeps answering.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

MAX_EXPANSION = 20_000  # subschemas once references are followed
MAX_STEPS = 100_000     # keyword applications of one check: about 1 s of CPU at worst (13 µs each)


class TooMuchWork(Exception):
    """A check went past its step budget or its deadline."""


@dataclass
class _Budget:
    left: int
    deadline: float | None
    spent: int = 0


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("schema_budget",
                                                                        default=None)


def _spend(cost: int) -> None:
    budget = _budget.get()
    if budget is None:
        return
    budget.left -= cost
    budget.spent += cost
    if budget.left < 0:
        raise TooMuchWork(f"more than {budget.spent - cost} steps")
    if budget.deadline is not None and budget.spent & 1023 < cost \
            and time.monotonic() > budget.deadline:
        raise TooMuchWork("past its deadline")


def budgeted(steps: int, deadline: float | None, run: Callable[[], Any]) -> Any:
    """``run()`` with at most ``steps`` keyword applications (and, with ``deadline``, a
    ``time.monotonic()`` to finish by); ``TooMuchWork`` past either."""
    token = _budget.set(_Budget(steps, deadline))
    try:
        return run()
    finally:
        _budget.reset(token)


# ---- at load ----------------------------------------------------------------------------------

def _anchors(schema: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            for key in ("$anchor", "$dynamicAnchor"):
                if isinstance(node.get(key), str):
                    found.setdefault(node[key], node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return found


def target(schema: Any, ref: str, anchors: dict[str, Any] | None = None) -> Any:
    """What a ``#...`` reference names in ``schema`` (a JSON pointer or an anchor), or None."""
    if not ref.startswith("#"):
        return None
    fragment = unquote(ref[1:])
    if not fragment:
        return schema
    if not fragment.startswith("/"):
        return (anchors if anchors is not None else _anchors(schema)).get(fragment)
    node: Any = schema
    for part in fragment[1:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def expansion(schema: Any, limit: int = MAX_EXPANSION) -> int:
    """How many subschemas ``schema`` has with its local references followed, counting up to
    ``limit + 1`` (it stops there). Linear in the schema's size: each reference target is
    counted once and its count reused; a reference into a cycle being counted counts one."""
    anchors = _anchors(schema)
    done: dict[str, int] = {}
    open_refs: set[str] = set()

    def count(node: Any, depth: int) -> int:
        if depth > 64:  # schema_problems bounds the depth first; this only keeps Python's stack
            return limit + 1
        if isinstance(node, list):
            total = 0
            for item in node:
                total += count(item, depth + 1)
                if total > limit:
                    break
            return total
        if not isinstance(node, dict):
            return 0
        total = 1
        for key, value in node.items():
            if key in ("$ref", "$dynamicRef") and isinstance(value, str):
                total += follow(value, depth)
            else:
                total += count(value, depth + 1)
            if total > limit:
                break
        return total

    def follow(ref: str, depth: int) -> int:
        if ref in done:
            return done[ref]
        if ref in open_refs:
            return 1
        open_refs.add(ref)
        found = target(schema, ref, anchors)
        result = count(found, depth + 1) if found is not None else 0
        open_refs.discard(ref)
        done[ref] = min(result, limit + 1)
        return done[ref]

    return count(schema, 0)


@functools.lru_cache(maxsize=1024)
def _re2(pattern: str) -> Any:
    import re2

    options = re2.Options()
    options.log_errors = False
    return re2.compile(pattern, options=options)


def pattern_problem(pattern: Any) -> str | None:
    """Why RE2 cannot run ``pattern``, or None."""
    if not isinstance(pattern, str):
        return None
    try:
        _re2(pattern)
    except Exception as exc:  # re2.error: the message says what it lacks
        reason = str(exc.args[0] if exc.args else exc)
        reason = reason[2:-1] if reason.startswith(("b'", 'b"')) else reason
        return (f"{pattern!r} cannot be matched without backtracking ({reason}): the gateway "
                "matches patterns with RE2, which has no lookaround and no backreferences; "
                "rewrite it without them")
    return None


# ---- evaluation -------------------------------------------------------------------------------

def _unique_key(value: Any) -> Any:
    """A hashable form in which two JSON values are equal as JSON Schema compares them
    (1 and 1.0 are equal, true and 1 are not, key order does not count)."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, int | float):
        return ("n", value)
    if isinstance(value, list):
        return ("l", tuple(_unique_key(v) for v in value))
    if isinstance(value, dict):
        return ("d", frozenset((k, _unique_key(v)) for k, v in value.items()))
    return ("v", value)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, list | dict | str) else 1


_COSTS: dict[str, Callable[[Any, Any], int]] = {
    "enum": lambda v, _: 1 + _size(v),
    "required": lambda v, _: 1 + _size(v),
    "uniqueItems": lambda _, i: 1 + _size(i),
    "unevaluatedProperties": lambda _, i: 1 + 4 * _size(i),
    "unevaluatedItems": lambda _, i: 1 + 4 * _size(i),
    "patternProperties": lambda v, i: 1 + _size(v) * _size(i),
    "pattern": lambda _, i: 1 + _size(i) // 256,
}


def _counted(name: str, keyword: Callable[..., Any]) -> Callable[..., Any]:
    cost = _COSTS.get(name, lambda _v, _i: 1)

    def apply(validator: Any, value: Any, instance: Any, schema: Any) -> Any:
        _spend(cost(value, instance))
        return keyword(validator, value, instance, schema)
    return apply


def _pattern(validator: Any, pattern: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if validator.is_type(instance, "string") and not _re2(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator: Any, patterns: Any, instance: Any,
                        schema: Any) -> Iterator[Any]:
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in patterns.items():
        matcher = _re2(pattern)
        for key, value in instance.items():
            if matcher.search(key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _unique_items(validator: Any, unique: Any, instance: Any, schema: Any) -> Iterator[Any]:
    from jsonschema.exceptions import ValidationError

    if unique and validator.is_type(instance, "array"):
        keys = [_unique_key(v) for v in instance]
        if len(set(keys)) != len(keys):
            yield ValidationError(f"{instance!r} has non-unique elements")


@functools.lru_cache(maxsize=8)
def bounded(cls: Any) -> Any:
    """A validator class like ``cls`` whose keywords count their work and whose patterns and
    ``uniqueItems`` are the ones above."""
    from jsonschema.validators import extend

    own = {"pattern": _pattern, "patternProperties": _pattern_properties,
           "uniqueItems": _unique_items}
    keywords = {name: _counted(name, own.get(name, fn)) for name, fn in cls.VALIDATORS.items()}
    return extend(cls, validators=keywords)
