"""Byte-level helpers: where a scalar's text is, how to write a name there, what to cut.

Every edit in this package is a splice into the original source string. Nothing
is ever re-emitted through a YAML dumper, because a dumper normalises
indentation, quoting and flow padding, and a file that mixes styles would come
back changed in places nobody asked to touch (DESIGN.md §5). These helpers are
the only code that turns "this node" into "these characters".
"""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable, Sequence
from typing import Any

import yaml
from ruamel.yaml import YAML

_DOUBLE_ESCAPES = {
    "\\": "\\\\",
    '"': '\\"',
    "\0": "\\0",
    "\a": "\\a",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\v": "\\v",
    "\f": "\\f",
    "\r": "\\r",
    "\x1b": "\\e",
    "\x85": "\\N",
    "\xa0": "\\_",
    "\u2028": "\\L",
    "\u2029": "\\P",
}


class Unrewritable(Exception):
    """The text at a node's span is not what the parser said it holds.

    The splice would be a guess, so the whole operation is refused instead.
    """


def value_span(text: str, node: Any) -> tuple[int, int]:
    """The span of a scalar's own text, without any `&anchor` or `!tag` before it.

    ruamel's scalar start mark sits on the first property, and the properties
    must survive a rename, so they are skipped here.
    """
    start: int = node.start_mark.index
    end: int = node.end_mark.index
    while start < end and text[start] in "&!":
        while start < end and not text[start].isspace():
            start += 1
        while start < end and text[start].isspace():
            start += 1
    return start, end


@functools.lru_cache(maxsize=1024)
def plain_safe(value: str) -> bool:
    """Whether `value` reads back as the same string when written plain.

    Checked by loading it in block and flow positions with both ruamel (YAML
    1.2) and PyYAML (YAML 1.1), since either may read these files: `yes`, `1:30`
    or `1e3` are strings to one and not the other. Conservative by design: a
    name that is unsafe anywhere is quoted everywhere.
    """
    if not value or value != value.strip():
        return False
    ruamel = YAML(typ="safe", pure=True)
    forms: list[tuple[str, object]] = [
        (f"k: {value}\n", {"k": value}),
        (f"{{k: {value}}}\n", {"k": value}),
        (f"[{value}]\n", [value]),
        (f"- {value}\n", [value]),
    ]
    for source, expected in forms:
        try:
            if yaml.safe_load(source) != expected:
                return False
            if ruamel.load(io.StringIO(source)) != expected:
                return False
        except Exception:
            return False
    return True


def quote_single(value: str) -> str:
    """A single-quoted scalar: the only escape is a doubled quote."""
    return "'" + value.replace("'", "''") + "'"


def quote_double(value: str) -> str:
    """A double-quoted scalar with YAML escapes for quotes, backslashes and controls."""
    out: list[str] = []
    for ch in value:
        if ch in _DOUBLE_ESCAPES:
            out.append(_DOUBLE_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def render(text: str, node: Any, old: str, new: str) -> tuple[int, int, str]:
    """The splice (start, end, replacement) that makes `node` read `new`, keeping its style.

    Plain stays plain when the new value is safe plain, otherwise it becomes
    single-quoted (the smallest change that keeps the value a string). Quoted
    scalars keep their quote character. A literal or folded block keeps its
    header and indentation; only the line holding the name changes.
    """
    start, end = value_span(text, node)
    source = text[start:end]
    style = node.style
    if style is None:
        if source != old:
            raise Unrewritable(f"expected {old!r} at offset {start}, found {source!r}")
        return start, end, new if plain_safe(new) else quote_single(new)
    if style == "'":
        if not (source.startswith("'") and source.endswith("'")):
            raise Unrewritable(f"expected a single-quoted scalar at offset {start}")
        return start, end, quote_single(new)
    if style == '"':
        if not (source.startswith('"') and source.endswith('"')):
            raise Unrewritable(f"expected a double-quoted scalar at offset {start}")
        return start, end, quote_double(new)
    if style in ("|", ">"):
        header_end = source.find("\n")
        body = source[header_end + 1 :] if header_end >= 0 else ""
        if header_end < 0 or body.count(old) != 1 or body.strip() != old:
            raise Unrewritable(f"cannot find {old!r} alone in the block scalar at offset {start}")
        at = start + header_end + 1 + body.index(old)
        return at, at + len(old), new
    raise Unrewritable(f"unknown scalar style {style!r} at offset {start}")


def splice(text: str, edits: Iterable[tuple[int, int, str]]) -> str:
    """Apply non-overlapping replacements; identical duplicates (an alias) count once."""
    unique = sorted(set(edits))
    out: list[str] = []
    pos = 0
    for start, end, replacement in unique:
        if start < pos:
            raise Unrewritable(f"overlapping edits at offset {start}")
        out.append(text[pos:start])
        out.append(replacement)
        pos = end
    out.append(text[pos:])
    return "".join(out)


def line_start(text: str, pos: int) -> int:
    """Index of the first character of the line holding `pos`."""
    return text.rfind("\n", 0, pos) + 1


def line_after(text: str, end: int) -> int:
    """Index just past the line break that ends the line holding `end - 1`."""
    if end > 0 and text[end - 1] == "\n":
        return end
    found = text.find("\n", end)
    return len(text) if found < 0 else found + 1


def previous_line(text: str, start: int) -> tuple[int, str] | None:
    """The line ending right before the line starting at `start`, or None at the top."""
    if start == 0:
        return None
    begin = line_start(text, start - 1)
    return begin, text[begin:start].rstrip("\r\n")


def attached_start(text: str, start: int, column: int) -> int:
    """Move `start` up over the comment lines directly above it that belong to it.

    A comment belongs to the thing below it when no blank line separates them
    and it is not indented deeper (a deeper one closes the previous item).
    """
    while (prev := previous_line(text, start)) is not None:
        begin, line = prev
        stripped = line.lstrip(" \t")
        if not stripped.startswith("#") or len(line) - len(stripped) > column:
            break
        start = begin
    return start


def eat_blank_lines_above(text: str, start: int) -> int:
    """Move `start` up over blank lines, so cutting a last item leaves no gap at the end."""
    while (prev := previous_line(text, start)) is not None and not prev[1].strip():
        start = prev[0]
    return start


def find_dash(text: str, item_start: int) -> int:
    """The `-` indicator of the block sequence entry whose content starts at `item_start`."""
    pos = item_start - 1
    while pos >= 0:
        ch = text[pos]
        if ch in " \t":
            pos -= 1
        elif ch == "-":
            return pos
        elif ch == "\n":
            begin = line_start(text, pos)
            line = text[begin:pos].rstrip("\r")
            code = line.split(" #", 1)[0].rstrip() if " #" in line else line.rstrip()
            if line.lstrip().startswith("#"):
                pos = begin - 1
            elif code.endswith("-"):
                return begin + len(code) - 1
            else:
                break
        else:
            break
    raise Unrewritable(f"no sequence indicator before offset {item_start}")


def merge(ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of cut ranges: neighbouring removals may claim the same blank lines."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def cut(text: str, ranges: Sequence[tuple[int, int]]) -> str:
    """Delete every range (merged first) from the text."""
    return splice(text, ((s, e, "") for s, e in merge(ranges)))
