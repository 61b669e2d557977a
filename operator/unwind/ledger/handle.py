"""The handle kept in a ledger entry, redaction, and the undo built back from the handle.

Arguments are never stored whole. The handle keeps, at their own paths, only the values
that the manifest's references name: the compensation's argument map, its verification
arguments, the deadline and the lookup (and a draft's handle when the call was staged). So
resolving those references against the handle gives exactly what resolving them against
the whole call gives, and the undo is built from the ledger alone.

``audit.redaction`` values are replaced by ``[redacted]`` wherever the handle holds them,
``$args`` and ``$result`` paths alike, and their text is masked in every message (an
upstream's error text included). A staged call's draft handle is masked the same way, by
path (a ``draft.handle`` value that reads, or holds, a redacted path), then by text. An
undo that needs a redacted value is unavailable, and says which reference reads it: a
masked value would build the wrong call.

A handle is bounded, so that it can always be stored: each kept value nests at most
``KEPT_MAX_DEPTH`` levels of objects and arrays and is JSON (no NaN or infinity), and the
kept values of one call take at most ``KEPT_MAX_BYTES`` as compact JSON. A value past a
bound raises ``HandleError`` naming the reference: the gateway refuses the call when the
arguments' half cannot be kept (before anything is sent), and records the entry
``uncertain`` when the answer's half cannot.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Iterator
from typing import Any

from ..manifest.keys import plain_text
from ..manifest.model import ToolManifest
from ..manifest.refs import (
    EACH,
    Each,
    Missing,
    Ref,
    RefSyntaxError,
    Segment,
    answer_path,
    parse_ref,
    resolve,
)
from ..manifest.undo_refs import covers, kept_references, redacted_needs, redaction_references

__all__ = ["kept_references", "redacted_needs", "redaction_references"]
from .entry import REDACTED, Handle

# A kept value nests at most this many levels of objects and arrays (the value itself is
# level 1): the gateway's doors bound arguments to 64 levels with the arguments object as
# level 1, so every argument that passed them can be kept.
KEPT_MAX_DEPTH = 64
# The kept values of one call (the handle, or a draft's handle), as compact JSON.
KEPT_MAX_BYTES = 64 * 1024


class HandleError(ValueError):
    """A kept value cannot be stored in the ledger; ``reason`` says which and why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def nesting_problem(value: Any, limit: int = KEPT_MAX_DEPTH) -> str | None:
    """Why ``value`` nests deeper than ``limit`` levels of objects and arrays (the value
    itself at level 1), or None; iterative, so it cannot run out of stack. The gateway's
    doors and its upstream client use it too."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth > limit:
            return f"nested deeper than {limit} levels of objects and arrays"
        stack.extend((child, depth + 1) for child in children)
    return None


def _checked(where: str, ref_text: str, value: Any) -> Any:
    """``value`` when the ledger can keep it, else HandleError naming the reference."""
    problem = nesting_problem(value)
    if problem is None:
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            problem = f"not JSON the ledger can store ({exc})"
    if problem is not None:
        raise HandleError(f"{where} keeps {ref_text}, which is {problem}")
    return value


def _size_checked(what: str, tree: Any) -> None:
    size = len(json.dumps(tree, ensure_ascii=False, separators=(",", ":")).encode())
    if size > KEPT_MAX_BYTES:
        raise HandleError(f"the values {what} keeps are {size} bytes as JSON, more than the "
                          f"ledger's bound of {KEPT_MAX_BYTES // 1024} KiB per call")


def _put(tree: Any, path: tuple[Segment, ...], value: Any) -> Any:
    """Set ``value`` at ``path`` (no ``[*]``) in a sparse copy-tree, creating dicts and lists
    on the way."""
    if not path:
        return copy.deepcopy(value)
    head, rest = path[0], path[1:]
    if isinstance(head, Each):
        raise ValueError("a projection is kept item by item, at each item's own path")
    if isinstance(head, int):
        items = tree if isinstance(tree, list) else []
        items.extend([None] * (head + 1 - len(items)))
        items[head] = _put(items[head], rest, value)
        return items
    node = tree if isinstance(tree, dict) else {}
    node[str(head)] = _put(node.get(str(head)), rest, value)
    return node


def _pad(tree: Any, path: tuple[Segment, ...], n: int) -> Any:
    """Make the value at ``path`` (no ``[*]``) a list of at least ``n`` items (None where
    nothing is kept), so a projection over the kept list has as many items as the call's."""
    if not path:
        items = tree if isinstance(tree, list) else []
        items.extend([None] * (n - len(items)))
        return items
    head, rest = path[0], path[1:]
    if isinstance(head, Each):
        raise ValueError("a list to pad is named by a path without [*]")
    if isinstance(head, int):
        items = tree if isinstance(tree, list) else []
        items.extend([None] * (head + 1 - len(items)))
        items[head] = _pad(items[head], rest, n)
        return items
    node = tree if isinstance(tree, dict) else {}
    node[str(head)] = _pad(node.get(str(head)), rest, n)
    return node


def _mask(tree: Any, path: tuple[Segment, ...]) -> Any:
    """Replace the value at ``path`` (when present; ``[*]``: in every item) with the
    redaction marker."""
    if not path:
        return REDACTED
    head, rest = path[0], path[1:]
    if head is EACH:
        if isinstance(tree, list):
            for i, item in enumerate(tree):
                tree[i] = _mask(item, rest)
    elif isinstance(head, int) and isinstance(tree, list) and head < len(tree):
        tree[head] = _mask(tree[head], rest)
    elif isinstance(tree, dict) and str(head) in tree:
        tree[str(head)] = _mask(tree[str(head)], rest)
    return tree


def _masked_copy(value: Any, path: tuple[Segment, ...]) -> Any:
    """``value`` with the part at ``path`` (when present; ``[*]``: in every item) replaced
    by the redaction marker, copying only along the path: the caller's value is never
    changed."""
    if not path:
        return REDACTED
    head, rest = path[0], path[1:]
    if head is EACH:
        return [_masked_copy(item, rest) for item in value] if isinstance(value, list) else value
    if isinstance(head, int) and isinstance(value, list) and head < len(value):
        items = list(value)
        items[head] = _masked_copy(items[head], rest)
        return items
    if isinstance(value, dict) and str(head) in value:
        node = dict(value)
        node[str(head)] = _masked_copy(node[str(head)], rest)
        return node
    return value


def mask_paths(value: Any, at: Ref, redacted: Iterable[Ref]) -> Any:
    """The value read at reference ``at``, masked where a redaction path covers it: whole
    when ``at`` lies inside a redacted path, in part when a redacted path lies inside it.
    A redacted ``[*]`` stands for every index; a projection ``at`` is masked item by item."""
    redacted = list(redacted)
    if at.projects:
        if not isinstance(value, list):
            return value
        to_list, within = at.split()
        return [mask_paths(item, Ref(at.root, (*to_list, i, *within)), redacted)
                for i, item in enumerate(value)]
    for r in redacted:
        if r.root != at.root:
            continue
        if covers(r.path, at.path):
            return REDACTED
        if covers(at.path, r.path):
            value = _masked_copy(value, r.path[len(at.path):])
    return value


def _kept_items(ref: Ref, args: Any, result: Any, before: Any) -> tuple[tuple[Segment, ...], int,
                                                                        list[tuple[Ref, Any]]]:
    """A projection's list path, its length (-1: no list) and each item's value present at
    its own path (``[*]`` replaced by the index): what the handle keeps of a projection, so
    that the projection over the handle finds what it found over the call, a missing item
    included."""
    to_list, within = ref.split()
    items = resolve(Ref(ref.root, to_list), args, result, None, before)
    if not isinstance(items, list):
        return to_list, -1, []
    out = []
    for i in range(len(items)):
        at = Ref(ref.root, (*to_list, i, *within))
        value = resolve(at, args, result, None, before)
        if not isinstance(value, Missing):
            out.append((at, value))
    return to_list, len(items), out


def build_handle(m: ToolManifest, args: Any, result: Any, *, staged: bool = False,
                 strict: bool = False, before: Any = None) -> Handle:
    """The handle of a finished call: the kept values at their paths, redaction applied.
    A value the ledger cannot store (see the module docstring) raises HandleError when
    ``strict`` (the gateway recording a call), else it is left out, as if absent (a
    report of a refused call or a dry run). ``before`` is the capture's answer: its
    ``$before`` paths are kept in ``handle.before`` (None when nothing was captured)."""
    trees: dict[str, Any] = {"args": {}, "result": {}, "before": {}}
    kept = False  # a tree holds a value (else it is empty, and far below the size bound)
    redacted = redaction_references(m)
    for where, ref in kept_references(m, staged=staged):
        kept = True
        found: list[tuple[Ref, Any]]
        if ref.projects:
            to_list, n, found = _kept_items(ref, args, result, before)
            if n >= 0:
                trees[ref.root] = _pad(trees[ref.root], to_list, n)
        else:
            value = resolve(ref, args, result, None, before)
            found = [] if isinstance(value, Missing) else [(ref, value)]
        for at, value in found:
            try:
                value = _checked(where, at.text(), mask_paths(value, at, redacted))
            except HandleError:
                if strict:
                    raise
                continue
            trees[ref.root] = _put(trees[ref.root], at.path, value)
    for ref in redacted:
        if ref.root in trees:
            trees[ref.root] = _mask(trees[ref.root], ref.path)
    if strict and kept:
        _size_checked("the handle", trees)
    return Handle(args=trees["args"], result=trees["result"],
                  before=trees["before"] if before is not None else None)


def after_tree(m: ToolManifest, answer: Any) -> Any:
    """What the read right after the call (``verification.after_call``) found at each
    ``expect`` path, at that path, redaction applied (a ``$result`` or ``$before`` path that
    covers it masks it: both name the object's fields), for ``Handle.after``. Values the
    answer lacks are left out; the divergence check then has nothing to compare for them."""
    v = m.compensation.verification if m.compensation else None
    tree: Any = {}
    if v is None:
        return tree
    redacted = [Ref("result", r.path) for r in redaction_references(m)
                if r.root in ("result", "before")]
    for path in v.expect:
        try:
            at = answer_path(path)
        except RefSyntaxError:
            continue
        value = resolve(at, None, answer)
        if isinstance(value, Missing):
            continue
        try:
            value = _checked(f"compensation.verification.expect.{path}", at.text(),
                             mask_paths(value, at, redacted))
        except HandleError:
            continue
        tree = _put(tree, at.path, value)
    _size_checked("the read after the call", tree)
    return tree


def missing_captured(m: ToolManifest, before: Any) -> list[str]:
    """The required ``$before`` references the capture's answer does not hold, as
    sentences: a call whose undo would need them is refused before it is sent."""
    out = []
    for where, ref in kept_references(m):
        if ref.root != "before" or ref.optional:
            continue
        value = resolve(ref, None, None, None, before)
        if isinstance(value, Missing):
            out.append(f"{where} reads {ref.text()}: {value.reason}")
    return out


def staged_handle(m: ToolManifest, args: Any, result: Any,
                  secrets: list[str]) -> dict[str, Any]:
    """A staged call's ``draft.handle``, resolved over the call and the draft's answer,
    masked by path like the handle (``$args`` and ``$result`` redaction paths alike), then
    by text. Raises HandleError when a value cannot be stored."""
    if m.draft is None:
        return {}
    redacted = redaction_references(m)
    out: dict[str, Any] = {}
    for name, raw in m.draft.handle.items():
        try:
            ref = parse_ref(raw)
        except RefSyntaxError:
            continue  # the validator refuses such a manifest before it is served
        value = resolve(ref, args, result)
        if isinstance(value, Missing):
            continue
        where = f"draft.handle.{name}"
        out[name] = mask_value(_checked(where, ref.text(), mask_paths(value, ref, redacted)),
                               secrets)
    _size_checked("the draft's handle", out)
    return out


def mask_answer(m: ToolManifest, data: Any, secrets: list[str]) -> Any:
    """An upstream's answer (an error body) with the ``$result`` redaction paths masked,
    then the secret texts: what a 502 body may carry."""
    for ref in redaction_references(m):
        if ref.root == "result":
            data = _masked_copy(data, ref.path)
    return mask_value(data, secrets)


def secret_texts(m: ToolManifest, args: Any, result: Any = None, before: Any = None) -> list[str]:
    """The text of every redacted value present in this call, longest first, for masking."""
    texts: set[str] = set()
    for ref in redaction_references(m):
        if ref.root == "before" and before is None:
            continue
        if ref.projects:  # every item's value that is there, even when another's is not
            values = [v for _, v in _kept_items(ref, args, result, before)[2]]
        else:
            value = resolve(ref, args, result, None, before)
            values = [] if isinstance(value, Missing) else [value]
        for leaf in _leaves(values):
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
