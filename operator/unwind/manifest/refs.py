"""The reference grammar used by argument maps, verification arguments, redaction paths,
lookup and draft arguments, and deadlines.

    $args.<path>     a value from the call's arguments
    $result.<path>   a value from the upstream's answer
    $key             the idempotency key (lookups only)
    $before.<path>   a value of the state the manifest's ``capture`` read before the call
                     (the undo's arguments and its verification only)
    $current.<path>  a value of the state ``compensation.current`` reads right before the
                     undo runs (the undo's arguments and headers only)
    {const: <v>}     a literal

A path is dotted names with ``[n]`` or ``.n`` indices; a trailing ``?`` makes the value
optional. One ``[*]`` (a projection) takes the rest of the path from every item of a list
and yields the list of those values, in order: ``$args.entities[*].name``. A reference has
at most one ``[*]``. There are no other wildcards, filters or expressions: a reference
either names its value (one value, or one value per item) or it does not, so an undo is
never built from a guess. A projection is missing as a whole when its list is, or when any
item lacks the path (or holds null there); ``?`` then drops it as a whole.
"""

from __future__ import annotations

import difflib
import enum
import re
from dataclasses import dataclass
from typing import Any, Literal

Root = Literal["args", "result", "key", "const", "before", "current"]


class Each(enum.Enum):
    """The ``[*]`` segment of a projection: every item of a list."""

    ITEM = "[*]"


EACH = Each.ITEM
Segment = str | int | Each

_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_INDEX = re.compile(r"\[(\d+)\]")
_EACH_TEXT = "[*]"


class RefSyntaxError(ValueError):
    """A reference that does not parse; the message says what to write instead."""


@dataclass(frozen=True)
class Ref:
    root: Root
    path: tuple[Segment, ...] = ()
    optional: bool = False
    value: Any = None  # the literal, for root == "const"

    def text(self) -> str:
        if self.root == "const":
            return f"{{const: {self.value!r}}}"
        return "$" + self.root + path_text(self.path) + ("?" if self.optional else "")

    @property
    def projects(self) -> bool:
        """A projection (``[*]``): its value is a list, one item per item of the list."""
        return EACH in self.path

    def split(self) -> tuple[tuple[Segment, ...], tuple[Segment, ...]]:
        """(the path to the projected list, the path within each item); ``(path, ())``
        when the reference does not project."""
        if EACH not in self.path:
            return self.path, ()
        i = self.path.index(EACH)
        return self.path[:i], self.path[i + 1:]


def path_text(path: tuple[Segment, ...]) -> str:
    """``.name[0][*].id``: a path as references write it."""
    out = ""
    for seg in path:
        if seg is EACH:
            out += _EACH_TEXT
        else:
            out += f"[{seg}]" if isinstance(seg, int) else f".{seg}"
    return out


@dataclass(frozen=True)
class Missing:
    """Resolution found nothing; ``reason`` says which part of the path was absent."""

    reason: str


def parse_ref(raw: Any) -> Ref:
    """Parse one reference, raising RefSyntaxError with a message that says what to fix."""
    if isinstance(raw, dict):
        if set(raw) == {"const"}:
            return Ref(root="const", value=raw["const"])
        raise RefSyntaxError(
            "a literal is written {const: <value>} with no other keys; "
            f"got keys {sorted(map(str, raw))}"
        )
    if not isinstance(raw, str):
        raise RefSyntaxError(
            f"{raw!r} is not a reference: write $args.<path>, $result.<path>, "
            "$before.<path>, $key or {const: <value>}"
        )
    text = raw.strip()
    optional = text.endswith("?")
    if optional:
        text = text[:-1]
    if text == "$key":
        return Ref(root="key", optional=optional)
    for root in ("args", "result", "before", "current"):
        prefix = "$" + root
        if text == prefix:
            raise RefSyntaxError(f"{raw!r} names no field: write {prefix}.<field>")
        if text.startswith(prefix + ".") or text.startswith(prefix + "["):
            start = len(raw) - len(raw.lstrip()) + len(prefix)  # where the path begins in raw
            return Ref(root=root, path=_parse_path(raw, text[len(prefix):], start), optional=optional)
    raise RefSyntaxError(
        f"{raw!r} is not a reference{_suggestion(text)}: it must start with $args., $result., "
        "$before., $current. or be $key (or a literal {const: <value>})"
    )


def answer_path(key: str) -> Ref:
    """A path written without its root (an ``expect`` or ``absent.shape`` key) as a
    reference into an answer; like ``$result[0].id``, it may start with an index
    (``[0].email``)."""
    return parse_ref("$result" + ("" if key.strip().startswith("[") else ".") + key)


def expected_reference(raw: Any) -> Ref | None:
    """A verification's expected value as a reference, or None when it is a literal.

    A string that starts with ``$`` is a reference (``$args.destination``, ``$before.name``);
    ``{const: <v>}`` is the literal ``v`` (the way to expect a text that starts with ``$``);
    any other value is a literal compared as it is. Raises RefSyntaxError for a ``$`` text
    that does not parse."""
    if isinstance(raw, str) and raw.strip().startswith("$"):
        return parse_ref(raw)
    if isinstance(raw, dict) and set(raw) == {"const"}:
        return Ref(root="const", value=raw["const"])
    return None


def resolve_expected(expect: dict[str, Any], args: Any, result: Any, key: str | None = None,
                     before: Any = None) -> tuple[dict[str, Any], list[str]]:
    """A verification's ``expect`` with each expected reference resolved (literals as
    written), and a reason per reference that is missing or does not parse."""
    out: dict[str, Any] = {}
    missing: list[str] = []
    for path, raw in expect.items():
        try:
            ref = expected_reference(raw)
        except RefSyntaxError as exc:
            missing.append(f"expect {path}: {exc}")
            continue
        value = raw if ref is None else resolve(ref, args, result, key, before)
        if isinstance(value, Missing):
            missing.append(f"expect {path}: {value.reason}")
        else:
            out[path] = value
    return out, missing


def _suggestion(text: str) -> str:
    """`$arg.id` -> `$args.id`, `$results.x` -> `$result.x`, `args.id` -> `$args.id`."""
    match = re.match(r"\$?([A-Za-z_]+)(.*)", text, re.S)
    if not match:
        return ""
    word, rest = match.groups()
    close = difflib.get_close_matches(word.lower(), ["args", "result", "key", "before", "current"], n=1, cutoff=0.6)
    if not close:
        return ""
    if close[0] == "key":
        return " (did you mean $key?)"
    return f" (did you mean ${close[0]}{rest}?)"


def _parse_path(raw: str, rest: str, start: int = 0) -> tuple[Segment, ...]:
    """The segments of ``rest``, the path part of ``raw`` that begins at index ``start``
    (errors count characters of ``raw`` from 1)."""
    segments: list[Segment] = []
    pos = 0
    while pos < len(rest):
        if rest[pos] == ".":
            match = _NAME.match(rest, pos + 1)
            if not match:
                raise RefSyntaxError(
                    f"{raw!r}: expected a field name after the '.' at character "
                    f"{start + pos + 1} "
                    "(names are letters, digits, _ and -; no wildcards or expressions)"
                )
            name = match.group(0)
            segments.append(int(name) if name.isdigit() else name)
            pos = match.end()
        elif rest.startswith(_EACH_TEXT, pos):
            if EACH in segments:
                raise RefSyntaxError(
                    f"{raw!r}: a reference has at most one [*] (a projection yields a flat "
                    "list of one value per item; lists of lists are not built)")
            segments.append(EACH)
            pos += len(_EACH_TEXT)
        elif rest[pos] == "[":
            match = _INDEX.match(rest, pos)
            if not match:
                raise RefSyntaxError(
                    f"{raw!r}: an index is written [n] with a non-negative integer, and "
                    "every item of a list [*]"
                )
            segments.append(int(match.group(1)))
            pos = match.end()
        else:
            raise RefSyntaxError(
                f"{raw!r}: unexpected {rest[pos]!r}; a path is dotted names with [n] "
                "indices and at most one [*]"
            )
    return tuple(segments)


def resolve(ref: Ref, args: Any, result: Any, key: str | None = None,
            before: Any = None, current: Any = None) -> Any | Missing:
    """Return the referenced value, or Missing with the reason. ``before`` is the state the
    capture read before the call (None: nothing was captured); ``current`` the state read
    right before the undo (None: not read yet, or nothing found)."""
    if ref.root == "const":
        return ref.value
    if ref.root == "key":
        return key if key is not None else Missing("no idempotency key was sent")
    if ref.root == "before" and before is None:
        return Missing("nothing was captured before the call (the manifest declares no "
                       "capture, or the entry was recorded without one)")
    if ref.root == "current" and current is None:
        return Missing("the read before the undo (compensation.current) found nothing")
    current = {"args": args, "result": result, "before": before, "current": current}[ref.root]
    walked = "$" + ref.root
    if not ref.projects:
        return _walk(current, ref.path, walked)
    to_list, within = ref.split()
    items = _walk(current, to_list, walked)
    walked += path_text(to_list)
    if isinstance(items, Missing):
        return items
    if not isinstance(items, list):
        return Missing(f"{walked} is {_kind(items)}, not a list: [*] projects a list")
    out: list[Any] = []
    for i, item in enumerate(items):
        value = _walk(item, within, f"{walked}[{i}]")
        if isinstance(value, Missing):
            return value
        out.append(value)
    return out


def _walk(current: Any, path: tuple[Segment, ...], walked: str) -> Any | Missing:
    """The value at ``path`` (no ``[*]``) inside ``current``, ``walked`` naming it."""
    for seg in path:
        if isinstance(seg, int) and isinstance(current, list):
            if seg >= len(current):
                return Missing(f"{walked} has {len(current)} items, no index {seg}")
            current = current[seg]
        elif isinstance(current, dict) and not isinstance(seg, Each) and str(seg) in current:
            current = current[str(seg)]
        else:
            return Missing(f"{walked} has no {seg!r}")
        walked += path_text((seg,))
    if current is None:
        return Missing(f"{walked} is null")
    return current


def _kind(value: Any) -> str:
    return {dict: "an object", str: "a string", bool: "a bool"}.get(type(value), "a number")


def resolve_map(
    mapping: dict[str, Any], args: Any, result: Any, key: str | None = None, before: Any = None
) -> tuple[dict[str, Any], list[str]]:
    """Resolve an argument map. Optional missing values are dropped; each required missing
    value adds a reason (a non-empty list means the follow-up call is unavailable)."""
    out: dict[str, Any] = {}
    missing: list[str] = []
    for name, raw in mapping.items():
        ref = parse_ref(raw)
        value = resolve(ref, args, result, key, before)
        if isinstance(value, Missing):
            if not ref.optional:
                missing.append(f"{name}: {value.reason}")
        else:
            out[name] = value
    return out, missing
