"""The reference grammar used by argument maps, verification arguments, redaction paths,
lookup and draft arguments, and deadlines.

    $args.<path>     a value from the call's arguments
    $result.<path>   a value from the upstream's answer
    $key             the idempotency key (lookups only)
    $before.<path>   a value of the state the manifest's ``capture`` read before the call
                     (the undo's arguments and its verification only)
    {const: <v>}     a literal

A path is dotted names with ``[n]`` or ``.n`` indices; a trailing ``?`` makes the value
optional. There are no wildcards, filters or expressions: a reference either names one
value or it does not, so an undo is never built from a guess.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Any, Literal

Root = Literal["args", "result", "key", "const", "before"]
Segment = str | int

_NAME = re.compile(r"[A-Za-z0-9_\-]+")
_INDEX = re.compile(r"\[(\d+)\]")


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
        out = "$" + self.root
        for seg in self.path:
            out += f"[{seg}]" if isinstance(seg, int) else f".{seg}"
        return out + ("?" if self.optional else "")


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
    for root in ("args", "result", "before"):
        prefix = "$" + root
        if text == prefix:
            raise RefSyntaxError(f"{raw!r} names no field: write {prefix}.<field>")
        if text.startswith(prefix + ".") or text.startswith(prefix + "["):
            start = len(raw) - len(raw.lstrip()) + len(prefix)  # where the path begins in raw
            return Ref(root=root, path=_parse_path(raw, text[len(prefix):], start), optional=optional)
    raise RefSyntaxError(
        f"{raw!r} is not a reference{_suggestion(text)}: it must start with $args., $result., "
        "$before. or be $key (or a literal {const: <value>})"
    )


def _suggestion(text: str) -> str:
    """`$arg.id` -> `$args.id`, `$results.x` -> `$result.x`, `args.id` -> `$args.id`."""
    match = re.match(r"\$?([A-Za-z_]+)(.*)", text, re.S)
    if not match:
        return ""
    word, rest = match.groups()
    close = difflib.get_close_matches(word.lower(), ["args", "result", "key", "before"], n=1, cutoff=0.6)
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
        elif rest[pos] == "[":
            match = _INDEX.match(rest, pos)
            if not match:
                raise RefSyntaxError(
                    f"{raw!r}: an index is written [n] with a non-negative integer"
                )
            segments.append(int(match.group(1)))
            pos = match.end()
        else:
            raise RefSyntaxError(
                f"{raw!r}: unexpected {rest[pos]!r}; a path is dotted names with [n] indices"
            )
    return tuple(segments)


def resolve(ref: Ref, args: Any, result: Any, key: str | None = None,
            before: Any = None) -> Any | Missing:
    """Return the referenced value, or Missing with the reason. ``before`` is the state the
    capture read before the call (None: nothing was captured)."""
    if ref.root == "const":
        return ref.value
    if ref.root == "key":
        return key if key is not None else Missing("no idempotency key was sent")
    if ref.root == "before" and before is None:
        return Missing("nothing was captured before the call (the manifest declares no "
                       "capture, or the entry was recorded without one)")
    current = {"args": args, "result": result, "before": before}[ref.root]
    walked = "$" + ref.root
    for seg in ref.path:
        if isinstance(seg, int) and isinstance(current, list):
            if seg >= len(current):
                return Missing(f"{walked} has {len(current)} items, no index {seg}")
            current = current[seg]
        elif isinstance(current, dict) and str(seg) in current:
            current = current[str(seg)]
        else:
            return Missing(f"{walked} has no {seg!r}")
        walked += f"[{seg}]" if isinstance(seg, int) else f".{seg}"
    if current is None:
        return Missing(f"{walked} is null")
    return current


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
