"""Every place in a manifest that names another tool: the one table.

Set validation (does each named tool exist?), the operator's readers finalizer (who still
reads this tool?) and the editor (what must a rename rewrite, what blocks a removal?) all
read this table, so they cannot disagree. A field that names a tool but is missing here
is a bug: add it here and every one of them follows.

A field is a tuple of keys, ``EACH`` meaning every item of a list. ``SHORTHANDS`` lists
the places that may also be written as a bare string one level up (``requires: [a]`` for
``requires: [{tool: a}]``): the model normalizes them, YAML source keeps both forms.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

EACH = "[]"


@dataclass(frozen=True)
class ToolPlace:
    field: tuple[str, ...]
    why: str


READER_PLACES: tuple[ToolPlace, ...] = (
    ToolPlace(("compensation", "tool"), "the tool that undoes this one"),
    ToolPlace(("compensation", "verification", "tool"), "the read-only tool that checks the undo"),
    ToolPlace(("requires", EACH, "tool"), "a required tool"),
    ToolPlace(("replaced_by",), "the tool to use instead of a deprecated one"),
    ToolPlace(("lookup", "tool"), "the read-only tool that finds a lost effect"),
    ToolPlace(("draft", "tool"), "the tool that stages the call"),
    ToolPlace(("draft", "promote"), "the tool that makes a draft real"),
    ToolPlace(("draft", "discard"), "the tool that drops a draft"),
    ToolPlace(("capture", "tool"), "the read-only tool that captures the state a call changes"),
    ToolPlace(("compensation", "current", "tool"), "the read-only tool that reads the object "
              "right before the undo"),
)
SHORTHANDS: dict[tuple[str, ...], tuple[str, ...]] = {("requires", EACH, "tool"): ("requires", EACH)}


def names_at(node: Any, field: tuple[str, ...], path: str = "") -> Iterator[tuple[str, str]]:
    """(concrete path, tool name) for every string at ``field`` under a model or plain data."""
    if not field:
        if isinstance(node, str):
            yield path, node
        return
    key, rest = field[0], field[1:]
    if key == EACH:
        for i, item in enumerate(node if isinstance(node, list) else []):
            yield from names_at(item, rest, f"{path}[{i}]")
        return
    child = getattr(node, key, None) if isinstance(node, BaseModel) else (
        node.get(key) if isinstance(node, dict) else None)
    if child is not None:
        yield from names_at(child, rest, f"{path}.{key}" if path else key)
