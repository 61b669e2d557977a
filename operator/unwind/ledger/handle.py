"""The handle kept in a ledger entry, redaction, and the undo built back from the handle.

Arguments are never stored whole. The handle keeps, at their own paths, only the values
that the manifest's references name: the compensation's argument map, its verification
arguments, the deadline and the lookup (and a draft's handle when the call was staged). So
resolving those references against the handle gives exactly what resolving them against
the whole call gives, and the undo is built from the ledger alone.

``audit.redaction`` values are replaced by ``[redacted]`` wherever the handle holds them,
and their text is masked in every message (an upstream's error text included). An undo
that needs a redacted value is unavailable, and says which reference reads it: a masked
value would build the wrong call.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any

from ..manifest.keys import plain_text
from ..manifest.model import ToolManifest
from ..manifest.refs import Missing, resolve
from ..manifest.undo_refs import kept_references, redacted_needs, redaction_references

__all__ = ["kept_references", "redacted_needs", "redaction_references"]
from .entry import REDACTED, Handle


def _put(tree: Any, path: tuple[str | int, ...], value: Any) -> Any:
    """Set ``value`` at ``path`` in a sparse copy-tree, creating dicts and lists on the way."""
    if not path:
        return copy.deepcopy(value)
    head, rest = path[0], path[1:]
    if isinstance(head, int):
        items = tree if isinstance(tree, list) else []
        items.extend([None] * (head + 1 - len(items)))
        items[head] = _put(items[head], rest, value)
        return items
    node = tree if isinstance(tree, dict) else {}
    node[str(head)] = _put(node.get(str(head)), rest, value)
    return node


def _mask(tree: Any, path: tuple[str | int, ...]) -> Any:
    """Replace the value at ``path`` (when present) with the redaction marker."""
    if not path:
        return REDACTED
    head, rest = path[0], path[1:]
    if isinstance(head, int) and isinstance(tree, list) and head < len(tree):
        tree[head] = _mask(tree[head], rest)
    elif isinstance(tree, dict) and str(head) in tree:
        tree[str(head)] = _mask(tree[str(head)], rest)
    return tree


def build_handle(m: ToolManifest, args: Any, result: Any, *, staged: bool = False) -> Handle:
    """The handle of a finished call: the kept values at their paths, redaction applied."""
    trees: dict[str, Any] = {"args": {}, "result": {}}
    for _, ref in kept_references(m, staged=staged):
        value = resolve(ref, args, result)
        if not isinstance(value, Missing):
            trees[ref.root] = _put(trees[ref.root], ref.path, value)
    for ref in redaction_references(m):
        if ref.root in trees:
            trees[ref.root] = _mask(trees[ref.root], ref.path)
    return Handle(args=trees["args"], result=trees["result"])


def secret_texts(m: ToolManifest, args: Any, result: Any = None) -> list[str]:
    """The text of every redacted value present in this call, longest first, for masking."""
    texts: set[str] = set()
    for ref in redaction_references(m):
        value = resolve(ref, args, result)
        if isinstance(value, Missing):
            continue
        for leaf in _leaves(value):
            text = plain_text(leaf)
            if text:
                texts.add(text)
    return sorted(texts, key=len, reverse=True)


def _leaves(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for v in value.values():
            yield from _leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _leaves(v)
    else:
        yield value


def mask_text(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        text = text.replace(secret, REDACTED)
    return text


def mask_value(value: Any, secrets: list[str]) -> Any:
    """Mask secret text in every string of a JSON value (keys included)."""
    if not secrets:
        return value
    if isinstance(value, str):
        return mask_text(value, secrets)
    if isinstance(value, dict):
        return {mask_text(str(k), secrets): mask_value(v, secrets) for k, v in value.items()}
    if isinstance(value, list):
        return [mask_value(v, secrets) for v in value]
    if not isinstance(value, bool) and plain_text(value) in secrets:
        return REDACTED
    return value
