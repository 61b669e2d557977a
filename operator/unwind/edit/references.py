"""Every place in a manifest file or a contract test file that names a tool.

This table is the contract (semantic-edits-adr.txt §3, DESIGN.md §5): rename
rewrites exactly these places and remove refuses while any reader in them
remains. Its manifest rows come from `unwind.manifest.places.READER_PLACES`,
the one table that set validation and the operator's readers finalizer read
too: a manifest field that names a tool is added there, and all of them
follow. The rows for contract test cases and resources live here.

Field paths are tuples of mapping keys, with `[]` meaning "every item of this
list". A path only matches when it ends on a scalar, which is how `requires`
gets both of its forms from two rows: `requires[]` matches the string entries
and `requires[].tool` the `{tool, status}` entries.

Roles:

- ``definition``: the tool's own name. Renamed, never reported as a reader.
- ``reader``: another manifest or a test case naming the tool.
- ``object_name``: a ToolManifest resource's `metadata.name`. It is the
  Kubernetes object's name, not a tool reference, so it is only followed when
  it still looks derived from the tool name: if it equals the k8s-safe form of
  the old name (see `k8s_name`) it becomes the k8s-safe form of the new one;
  any other value was chosen by a person on purpose and is left alone. It is
  never counted in `rewrote` and never blocks a removal (the whole resource
  goes with its tool).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ruamel.yaml.nodes import MappingNode, ScalarNode, SequenceNode

from unwind.manifest.places import EACH, READER_PLACES, SHORTHANDS

Owner = Literal["manifest", "test_case", "resource"]
Role = Literal["definition", "reader", "object_name"]

STR_TAG = "tag:yaml.org,2002:str"


@dataclass(frozen=True)
class Place:
    """One row of the table: where, relative to its owner, a tool name lives."""

    owner: Owner
    field: tuple[str, ...]
    role: Role
    why: str


REFERENCES: tuple[Place, ...] = (
    Place("manifest", ("tool",), "definition", "the tool's own name"),
    # The manifest's reader places come from the one table in unwind.manifest.places,
    # each with its string shorthand where the format allows one.
    *(row for p in READER_PLACES for row in (
        (Place("manifest", SHORTHANDS[p.field], "reader", f"{p.why}, string form"),
         Place("manifest", p.field, "reader", f"{p.why}, {{tool, status}} form"))
        if p.field in SHORTHANDS else (Place("manifest", p.field, "reader", p.why),))),
    Place("test_case", ("tool",), "reader", "the tool a contract test case calls"),
    Place("test_case", ("after", EACH), "reader", "a tool a test case runs first"),
    Place("resource", ("metadata", "name"), "object_name", "the Kubernetes object name"),
)


def k8s_name(tool: str) -> str:
    """The k8s-safe form of a tool name: lowercase, anything outside [a-z0-9.-] becomes '-'."""
    return re.sub(r"[^a-z0-9.-]", "-", tool.lower())


_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def is_object_name(name: str) -> bool:
    """Whether Kubernetes accepts this as an object name (an RFC 1123 subdomain)."""
    return len(name) <= 253 and _SUBDOMAIN.fullmatch(name) is not None


def get(mapping: Any, key: str) -> Any:
    """The value node under `key` in a mapping node, following `<<` merge keys, or None."""
    if not isinstance(mapping, MappingNode):
        return None
    merges: list[Any] = []
    for key_node, value_node in mapping.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return value_node
        if isinstance(key_node, ScalarNode) and key_node.tag == "tag:yaml.org,2002:merge":
            merges.extend(
                value_node.value if isinstance(value_node, SequenceNode) else [value_node]
            )
    for merged in merges:
        found = get(merged, key)
        if found is not None:
            return found
    return None


def text_of(node: Any) -> str | None:
    """A scalar node's value when it is a string, else None (a number is never a name)."""
    if isinstance(node, ScalarNode) and node.tag == STR_TAG:
        value: str = node.value
        return value
    return None


def matches(owner_node: Any, place: Place) -> Iterator[tuple[ScalarNode, str]]:
    """Every string scalar at `place.field` under `owner_node`, with its concrete dotted path."""

    def walk(node: Any, rest: tuple[str, ...], path: str) -> Iterator[tuple[ScalarNode, str]]:
        if not rest:
            if text_of(node) is not None:
                yield node, path
            return
        head, tail = rest[0], rest[1:]
        if head == EACH:
            if isinstance(node, SequenceNode):
                for index, item in enumerate(node.value):
                    yield from walk(item, tail, f"{path}[{index}]")
            return
        child = get(node, head)
        if child is not None:
            yield from walk(child, tail, f"{path}.{head}" if path else head)

    yield from walk(owner_node, place.field, "")


def places(owner: Owner, role: Role | None = None) -> tuple[Place, ...]:
    """The rows for one owner kind, optionally one role."""
    return tuple(p for p in REFERENCES if p.owner == owner and (role is None or p.role == role))
