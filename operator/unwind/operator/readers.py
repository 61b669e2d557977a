"""Who reads a manifest, and the finalizer that keeps a read manifest from disappearing.

A ToolManifest that another live manifest names (as its compensation, verification,
requirement, replacement, lookup or draft tool) carries the finalizer
``unwind.dev/readers``. Deleting it then only marks it: it stays in the bundle, its status
lists every reader, and a Warning event says what to do, until the readers are deleted or
stop naming it. Deleting the readers in the same sync (a namespace, or `kubectl delete -f`
of the whole set) releases it, because a reader that is itself being deleted does not hold.
A manifest nobody reads carries no finalizer, so deleting it never waits for the operator.

Pure code: which objects need the finalizer added or removed is decided here; kube.py
patches them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ..manifest.model import ToolManifest
from ..manifest.validate import tool_references

FINALIZER = "unwind.dev/readers"


@dataclass(frozen=True)
class Reader:
    name: str  # the reading ToolManifest object
    path: str  # the field that names the tool, e.g. compensation.tool

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "path": self.path}


@dataclass(frozen=True)
class Held:
    """One object as the finalizer logic sees it."""

    name: str
    deleting: bool
    finalizers: tuple[str, ...]
    tool: str | None  # the tool it declares (current or last good), if any
    models: tuple[ToolManifest, ...]  # what it declares now and what it publishes


def readers_of(objects: Sequence[Held]) -> dict[str, list[Reader]]:
    """For each object name, the live objects that name its tool (sorted, no duplicates).
    ``objects`` come oldest first: the owner of a tool is the oldest object declaring it, the
    one that wins the duplicate rule, so the finalizer lands on the manifest in force."""
    owner: dict[str, str] = {}
    for o in objects:
        if o.tool is not None:
            owner.setdefault(o.tool, o.name)
    found: dict[str, set[Reader]] = {}
    for o in objects:
        if o.deleting:
            continue
        for model in o.models:
            for path, tool in tool_references(model):
                target = owner.get(tool)
                if target is not None and target != o.name:
                    found.setdefault(target, set()).add(Reader(o.name, path))
    return {name: sorted(rs, key=lambda r: (r.name, r.path)) for name, rs in found.items()}


def finalizer_updates(objects: Iterable[Held], readers: dict[str, list[Reader]]) -> dict[str, list[str]]:
    """The objects whose finalizers must change, with their new finalizer list."""
    out: dict[str, list[str]] = {}
    for o in objects:
        held = bool(readers.get(o.name))
        has = FINALIZER in o.finalizers
        if held and not has and not o.deleting:  # an object being deleted cannot gain one
            out[o.name] = [*o.finalizers, FINALIZER]
        elif has and not held:
            out[o.name] = [f for f in o.finalizers if f != FINALIZER]
    return out


def blocked_message(readers: list[Reader]) -> str:
    listed = ", ".join(f"{r.name} ({r.path})" for r in readers[:10])
    more = f" and {len(readers) - 10} more" if len(readers) > 10 else ""
    return (f"deletion waits: still read by ToolManifest {listed}{more}; delete those too, or "
            "edit them to stop naming this tool")
