"""An OpenAPI document's ``$ref``s, kept as references (``scaffold --from-openapi``; issue
29, item 9).

Before, the scaffold copied every referenced schema in place, so references that fan out
(component A names B twice, B names C twice...) were copied 2^n times: 2.6 KiB of OpenAPI
took 52 s and 700 MiB. Now a referenced schema is copied once, under the input schema's
``$defs``, and every reference to it becomes ``#/$defs/<name>``: the work is linear in the
document. (Whether such a schema may then serve as an ``input_schema`` is for
``schema_problems`` to say: one whose references expand past its bound is left out of the
draft, with a note.) Only what must be read to build the input schema is followed in
place: a parameter, a request body, and the body's top-level schema (``deref``), each a
chain of at most ``MAX_HOPS`` references.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

MAX_HOPS = 32    # a reference to a reference to ...: a chain is followed this far
MAX_DEPTH = 64   # a schema nested deeper is cut (and noted)
# Nodes copied for one document: a YAML document's aliases share nodes, which a copy
# would repeat (the $ref fan-out again, by other means).
MAX_COPIED = 500_000


class TooLarge(ValueError):
    """The document's schemas copy to more than ``MAX_COPIED`` nodes."""
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
_UNRESOLVED = "unresolved"  # what a remote or dangling reference points at instead: anything


def _pointed(doc: Mapping[str, Any], ref: str) -> Any:
    """What a local reference (``#/components/schemas/X``) names in ``doc``, or None."""
    node: Any = doc
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def deref(doc: Mapping[str, Any], node: Any) -> Any:
    """``node`` with the references at its top followed (a parameter, a request body, a
    schema); ``{}`` for a remote, dangling or too long chain."""
    for _ in range(MAX_HOPS):
        ref = node.get("$ref") if isinstance(node, Mapping) else None
        if not isinstance(ref, str):
            return node
        node = _pointed(doc, ref) if ref.startswith("#/") else None
        if node is None:
            return {}
    return {}


class Defs:
    """The schemas the input schemas of one document name, each copied once."""

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        self.names: dict[str, str] = {}   # reference -> its name under $defs
        self.copies: dict[str, Any] = {}  # name -> the copied schema
        self.notes: list[str] = []
        self.copied = 0

    def schema(self, node: Any) -> tuple[Any, dict[str, Any]]:
        """A copy of ``node`` whose local references point into ``$defs``, and the ``$defs``
        it needs (every definition reachable from it)."""
        copied = self._copy(node, 0)
        needed: dict[str, Any] = {}
        stack = list(_refs_in(copied))
        while stack:
            name = stack.pop()
            if name in needed or name not in self.copies:
                continue
            needed[name] = self.copies[name]
            stack.extend(_refs_in(needed[name]))
        return copied, dict(sorted(needed.items()))

    def _copy(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            self._note(f"a schema nests deeper than {MAX_DEPTH} levels: its deeper part is left out")
            return {}
        self.copied += 1
        if self.copied > MAX_COPIED:
            raise TooLarge(f"its schemas copy to more than {MAX_COPIED} nodes (YAML aliases that "
                           "repeat one node many times?): scaffold a smaller document")
        if isinstance(node, list):
            return [self._copy(v, depth + 1) for v in node]
        if not isinstance(node, Mapping):
            return node
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                out["$ref"] = self._ref(value)
            else:
                out[str(key)] = self._copy(value, depth + 1)
        return out

    def _ref(self, ref: str) -> Any:
        if ref in self.names:
            return f"#/$defs/{self.names[ref]}"
        found = _pointed(self.doc, ref) if ref.startswith("#/") else None
        if found is None:
            self._note(f"reference {ref!r} is {'remote' if not ref.startswith('#') else 'dangling'}: "
                       "it is left out of the input schema (nothing is fetched)")
            self.copies.setdefault(_UNRESOLVED, {})
            return f"#/$defs/{_UNRESOLVED}"
        base = _NOT_NAME.sub("_", ref.rsplit("/", 1)[-1].replace("~1", "/").replace("~0", "~"))
        name, n = base or "def", 1
        while name in self.copies or name == _UNRESOLVED:
            n += 1
            name = f"{base}_{n}"
        self.names[ref] = name
        self.copies[name] = {}  # taken before copying: a schema that names itself is one def
        self.copies[name] = self._copy(found, 1)
        return f"#/$defs/{name}"

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)


def _refs_in(node: Any) -> list[str]:
    """The ``$defs`` names a copied schema refers to."""
    out: list[str] = []
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            ref = item.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                out.append(ref[len("#/$defs/"):])
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return out
