"""The registry contract: named sequences of operations and what each must give.

Every row runs against every storage (see ``storage_harness`` in conftest.py); expected
results name tools, version numbers, lifecycles and error codes only, never anything a
storage chooses (paths, resource names), so the same rows hold for the folder and the
cluster. Rows marked ``read_side`` are also run with their ``load`` and ``verify`` steps
going through the remote loader (the folder served over HTTPS).

Keys are named: ``k1`` is the trusted key, ``k2`` a key nobody trusts. A refusal that
names no tool (``Refused("unsigned_index")``) is about the index as a whole; so is a
``verify`` finding ``(None, None, code)``. The loads of one row share the generations
they accept, as a gateway's reloads do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.registry import (
    Generations,
    MemoryGenerations,
    Registry,
    RegistryError,
    Storage,
    TrustStore,
)


def manifest(tool: str, **extra: Any) -> dict[str, Any]:
    return {"tool": tool, "effect": "read_only", "permission": "demo:read", **extra}


@dataclass(frozen=True)
class Refused:
    code: str
    tool: str | None = None
    version: int | None = None


@dataclass(frozen=True)
class Step:
    op: str
    args: dict[str, Any] = field(default_factory=dict)
    expect: Any = None


def publish(*items: str | dict[str, Any], by: str = "alice", status: str = "draft",
            key: str | None = "k1", expect: Any = None) -> Step:
    docs = [manifest(i) if isinstance(i, str) else i for i in items]
    return Step("publish", {"items": docs, "by": by, "status": status, "key": key}, expect)


def approve(tool: str, by: str = "bob", version: int | None = None, four_eyes: bool = False,
            key: str | None = "k1", expect: Any = None) -> Step:
    return Step("approve", {"tool": tool, "by": by, "version": version, "four_eyes": four_eyes,
                            "key": key}, expect)


def deprecate(tool: str, by: str = "carol", replaced_by: str | None = None,
              expect: Any = None) -> Step:
    return Step("deprecate", {"tool": tool, "by": by, "replaced_by": replaced_by, "key": "k1"},
                expect)


def rollback(tool: str, n: int, by: str = "carol", expect: Any = None) -> Step:
    return Step("rollback", {"tool": tool, "n": n, "by": by, "key": "k1"}, expect)


def load(trust: tuple[str, ...] | None = ("k1",), expect: Any = None) -> Step:
    return Step("load", {"trust": trust}, expect)


def verify(trust: tuple[str, ...] | None = ("k1",), expect: Any = ()) -> Step:
    return Step("verify", {"trust": trust}, expect)


def history(tool: str, expect: Any) -> Step:
    return Step("history", {"tool": tool}, expect)


def edit_version(tool: str, version: int, **changes: Any) -> Step:
    """Change the stored manifest of a version without going through the registry."""
    return Step("edit_version", {"tool": tool, "version": version, "changes": changes})


def swap_signature(tool: str, from_version: int, to_version: int) -> Step:
    """Copy one version's signature onto another, in its file and in the index."""
    return Step("swap_signature", {"tool": tool, "from": from_version, "to": to_version})


def sign_index(key: str = "k1", days_ago: int = 0, trust: tuple[str, ...] = (),
               expect: Any = None) -> Step:
    """``unwind manifests sign-index``, by a writer whose clock says ``days_ago`` days ago
    and who also trusts ``trust`` (besides its own key) on the index it signs over."""
    return Step("sign_index", {"key": key, "days_ago": days_ago, "trust": trust}, expect)


def generation(expect: int) -> Step:
    return Step("generation", {}, expect)


def save_index(name: str) -> Step:
    """Keep a copy of index.json as it is now (an attacker keeping an old signed copy)."""
    return Step("save_index", {"name": name})


def restore_index(name: str) -> Step:
    """Put a saved copy of index.json back, as it was signed (a rollback)."""
    return Step("restore_index", {"name": name})


def cut_index(tool: str, keep: int) -> Step:
    """Drop the tool's index entries above version ``keep``, leaving the signature as it is."""
    return Step("cut_index", {"tool": tool, "keep": keep})


@dataclass(frozen=True)
class Row:
    name: str
    steps: tuple[Step, ...]
    read_side: bool = False


ROWS: tuple[Row, ...] = (
    Row("publishing a manifest makes draft version 1, which load does not return", (
        publish("a", expect=[("a", 1, "draft")]),
        history("a", [(1, "draft", "publish")]),
        load(expect={}),
    ), read_side=True),
    Row("publishing the same manifest again writes nothing", (
        publish("a", expect=[("a", 1, "draft")]),
        publish("a", expect=[("a", 1, "draft", "unchanged")]),
        history("a", [(1, "draft", "publish")]),
    )),
    Row("publishing as approved makes version 1 enforceable", (
        publish("a", status="approved", expect=[("a", 1, "approved")]),
        load(expect={"a": (1, "approved")}),
    ), read_side=True),
    Row("approving a draft makes a new approved version", (
        publish("a"),
        approve("a", by="bob", expect=("a", 2, "approved")),
        history("a", [(1, "draft", "publish"), (2, "approved", "approve")]),
        load(expect={"a": (2, "approved")}),
    ), read_side=True),
    Row("with four eyes the author may not approve their own draft", (
        publish("a", by="alice"),
        approve("a", by="alice", four_eyes=True, expect=Refused("four_eyes", "a", 1)),
        load(expect={}),
    )),
    Row("with four eyes another person may approve the draft", (
        publish("a", by="alice"),
        approve("a", by="bob", four_eyes=True, expect=("a", 2, "approved")),
    )),
    Row("approving a version that is not a draft is refused", (
        publish("a", status="approved"),
        approve("a", expect=Refused("not_draft", "a", 1)),
    )),
    Row("approving a tool whose requirement has no approved version is refused", (
        publish(manifest("a", requires=["b"]), "b"),
        approve("a", expect=Refused("invalid", "a")),
        approve("b", expect=("b", 2, "approved")),
        approve("a", version=1, expect=("a", 2, "approved")),
        load(expect={"a": (2, "approved"), "b": (2, "approved")}),
    )),
    Row("deprecating with a replacement makes a deprecated version naming it", (
        publish("a", "b", status="approved"),
        deprecate("a", replaced_by="b", expect=("a", 2, "deprecated")),
        load(expect={"a": (2, "deprecated"), "b": (1, "approved")}),
    ), read_side=True),
    Row("deprecating a tool that has only a draft is refused", (
        publish("a"),
        deprecate("a", expect=Refused("no_approved_version", "a")),
    )),
    Row("deprecating with a replacement that is not in the registry is refused", (
        publish("a", status="approved"),
        deprecate("a", replaced_by="nope", expect=Refused("not_found", "nope")),
    )),
    Row("rolling back publishes an old version again as the newest", (
        publish("a", status="approved"),
        publish(manifest("a", description="second"), status="approved",
                expect=[("a", 2, "approved")]),
        rollback("a", 1, expect=("a", 3, "approved")),
        history("a", [(1, "approved", "publish"), (2, "approved", "publish"),
                      (3, "approved", "rollback")]),
        load(expect={"a": (3, "approved")}),
    ), read_side=True),
    Row("rolling back to a version that does not exist is refused", (
        publish("a"),
        rollback("a", 7, expect=Refused("not_found", "a")),
    )),
    Row("a draft newer than the approved version leaves the approved version in force", (
        publish("a", status="approved"),
        publish(manifest("a", description="next"), expect=[("a", 2, "draft")]),
        load(expect={"a": (1, "approved")}),
    ), read_side=True),
    Row("an edited version file is refused on load and reported by verify", (
        publish("a", status="approved"),
        edit_version("a", 1, permission="demo:admin"),
        load(expect=Refused("tampered", "a", 1)),
        load(trust=None, expect=Refused("tampered", "a", 1)),
        verify(expect=[("a", 1, "tampered")]),
    ), read_side=True),
    Row("an edited draft cannot be approved", (
        publish("a"),
        edit_version("a", 1, permission="demo:admin"),
        approve("a", expect=Refused("tampered", "a", 1)),
    )),
    Row("a version signed by an untrusted key is refused", (
        publish("a", status="approved", key="k2"),  # the index is signed by k2 too
        load(expect=Refused("untrusted_index")),
        load(trust=("k1", "k2"), expect={"a": (1, "approved")}),
        load(trust=None, expect={"a": (1, "approved")}),
        verify(expect=[(None, None, "untrusted_index"), ("a", 1, "untrusted")]),
    ), read_side=True),
    Row("a version signed by an untrusted key is refused under an index signed by a trusted key", (
        publish("a", status="approved", key="k2"),
        sign_index("k1", expect=Refused("untrusted_index")),  # k1's writer does not know k2
        sign_index("k1", trust=("k2",)),
        load(expect=Refused("untrusted", "a", 1)),
        verify(expect=[("a", 1, "untrusted")]),
    ), read_side=True),
    Row("a signature swapped between versions is refused", (
        publish("a", status="approved"),
        publish(manifest("a", description="second"), status="approved"),
        swap_signature("a", 1, 2),  # edits the index too, so its signature breaks first
        load(expect=Refused("bad_index_signature")),
        verify(expect=[(None, None, "bad_index_signature"), ("a", 2, "bad_signature")]),
    ), read_side=True),
    Row("an unsigned version is refused while a trust store is set", (
        publish("a", status="approved", key=None),
        sign_index("k1"),  # an old registry signed as it is: the version stays unsigned
        load(expect=Refused("unsigned", "a", 1)),
        load(trust=None, expect={"a": (1, "approved")}),
        verify(expect=[("a", 1, "unsigned")]),
        verify(trust=None, expect=[]),
    ), read_side=True),
    Row("an unsigned index is refused while a trust store is set", (
        publish("a", status="approved", key=None),
        load(expect=Refused("unsigned_index")),
        load(trust=None, expect={"a": (1, "approved")}),
        verify(expect=[(None, None, "unsigned_index"), ("a", 1, "unsigned")]),
    ), read_side=True),
    Row("each write of the index raises its generation by one", (
        publish("a"),
        generation(1),
        approve("a"),
        generation(2),
        publish("b", "c"),  # one index write per tool
        generation(4),
        publish("b"),  # unchanged: nothing written
        generation(4),
        sign_index("k1"),
        generation(5),
    )),
    Row("a version list cut back to an older signed version is refused", (
        publish("a", status="approved"),
        publish(manifest("a", description="second"), status="approved"),
        cut_index("a", keep=1),
        load(expect=Refused("bad_index_signature")),
        load(trust=None, expect={"a": (1, "approved")}),  # checksums alone cannot see it
    ), read_side=True),
    Row("verify reports the version files a cut-back index no longer lists", (
        publish("a", status="approved"),
        publish(manifest("a", description="second"), status="approved"),
        cut_index("a", keep=1),
        verify(expect=[(None, None, "bad_index_signature"), ("a", 2, "unlisted_version")]),
        verify(trust=None, expect=[("a", 2, "unlisted_version")]),
    )),
    Row("an older signed index served again is refused once a newer one was accepted", (
        publish("a", status="approved"),
        save_index("old"),
        publish(manifest("a", description="second"), status="approved"),
        load(expect={"a": (2, "approved")}),
        restore_index("old"),  # validly signed, and not expired
        load(expect=Refused("index_rollback")),
        load(trust=None, expect=Refused("index_rollback")),
    ), read_side=True),
    Row("an expired index is refused until it is signed again", (
        publish("a", status="approved"),
        sign_index("k1", days_ago=31),  # signed with the default TTL of 30 days
        load(expect=Refused("index_expired")),
        load(trust=None, expect={"a": (1, "approved")}),
        sign_index("k1"),
        load(expect={"a": (1, "approved")}),
    ), read_side=True),
    Row("a write without a key to a signed registry is refused", (
        publish("a"),
        publish(manifest("a", description="second"), key=None, expect=Refused("key_required")),
        approve("a", key=None, expect=Refused("key_required")),
        history("a", [(1, "draft", "publish")]),
    )),
    Row("a writer does not re-sign an index changed behind the registry's back", (
        publish("a", status="approved"),
        publish(manifest("a", description="second"), status="approved"),
        cut_index("a", keep=1),
        publish("b", expect=Refused("bad_index_signature")),
        sign_index("k1", expect=Refused("unlisted_version", "a", 2)),
        load(expect=Refused("bad_index_signature")),
    )),
    Row("history lists every version oldest first, and nothing is rewritten", (
        publish("a", by="alice"),
        approve("a", by="bob"),
        deprecate("a", by="carol"),
        rollback("a", 2, by="carol"),
        history("a", [(1, "draft", "publish"), (2, "approved", "approve"),
                      (3, "deprecated", "deprecate"), (4, "approved", "rollback")]),
        verify(expect=[]),
    )),
    Row("an invalid manifest is refused and nothing is written", (
        publish({"tool": "a", "effect": "sideways", "permission": "x"},
                expect=Refused("invalid", "a")),
        load(expect=Refused("not_found")),
    )),
)


class Harness(Protocol):
    def overwrite_version(self, storage: Storage, tool: str, version: int,
                          record: dict[str, Any]) -> None: ...

    def overwrite_index(self, storage: Storage, index: dict[str, Any]) -> None: ...


def _trust(names: tuple[str, ...] | None, keys: dict[str, Ed25519PrivateKey]) -> TrustStore | None:
    return None if names is None else TrustStore(keys[n].public_key() for n in names)


def _outcome(o: Any) -> tuple[Any, ...]:
    r = o.record
    return (r.tool, r.version, r.lifecycle) if o.changed else (r.tool, r.version, r.lifecycle,
                                                               "unchanged")


def _sign_index(storage: Storage, keys: dict[str, Ed25519PrivateKey], a: dict[str, Any]) -> int:
    when = datetime.now(UTC) - timedelta(days=a["days_ago"])
    writer = Registry(storage, clock=lambda: when, trust=_trust(a["trust"], keys))
    return writer.sign_index(keys[a["key"]]).generation


def _check_refusal(exc: RegistryError, expect: Refused, where: str) -> None:
    assert exc.code == expect.code, f"{where}: expected {expect.code}, got {exc.code}: {exc}"
    if expect.tool is not None:
        assert expect.tool in exc.message, f"{where}: {exc.message!r} does not name {expect.tool}"
    if expect.version is not None:
        assert f"v{expect.version}" in exc.message, f"{where}: {exc.message!r} lacks the version"


def _perform(step: Step, registry: Registry, read: Callable[[], Registry], storage: Storage,
             harness: Harness, keys: dict[str, Ed25519PrivateKey], saved: dict[str, Any]) -> Any:
    a = step.args
    key = keys[a["key"]] if a.get("key") else None
    if step.op == "publish":
        return [_outcome(o) for o in registry.publish(a["items"], by=a["by"], status=a["status"],
                                                      key=key)]
    if step.op == "approve":
        return _outcome(registry.approve(a["tool"], by=a["by"], version=a["version"],
                                         four_eyes=a["four_eyes"], key=key))
    if step.op == "deprecate":
        return _outcome(registry.deprecate(a["tool"], by=a["by"], replaced_by=a["replaced_by"],
                                           key=key))
    if step.op == "rollback":
        return _outcome(registry.rollback(a["tool"], a["n"], by=a["by"], key=key))
    if step.op == "history":
        return [(r.version, r.lifecycle, r.action) for r in registry.history(a["tool"])]
    if step.op == "load":
        loaded = read().load(_trust(a["trust"], keys))
        return {t: (m.version, str(m.lifecycle)) for t, m in loaded.items()}
    if step.op == "verify":
        return [(p.tool, p.version, p.code) for p in read().verify(_trust(a["trust"], keys))]
    if step.op == "edit_version":
        return _edit(storage, harness, a)
    if step.op == "swap_signature":
        return _swap(storage, harness, a)
    if step.op == "sign_index":
        return _sign_index(storage, keys, a)
    if step.op == "generation":
        return registry.read_index().generation
    if step.op == "save_index":
        saved[a["name"]] = storage.read_index()
        return None
    if step.op == "restore_index":
        return harness.overwrite_index(storage, saved[a["name"]])
    if step.op == "cut_index":
        index = storage.read_index()
        index["tools"][a["tool"]] = [e for e in index["tools"][a["tool"]] if e["version"] <= a["keep"]]
        return harness.overwrite_index(storage, index)
    raise AssertionError(f"unknown step {step.op}")


def run_row(row: Row, storage: Storage, harness: Harness, keys: dict[str, Ed25519PrivateKey],
            reader: Callable[[Generations], Registry] | None = None) -> None:
    """Run every step; ``reader`` gives the registry load/verify read through (default: the
    same storage), keeping accepted generations in the row's one store."""
    registry = Registry(storage)
    generations = MemoryGenerations()
    make = reader or (lambda g: Registry(storage, generations=g))
    saved: dict[str, Any] = {}
    for i, step in enumerate(row.steps):
        where = f"{row.name!r} step {i + 1} ({step.op})"
        try:
            got = _perform(step, registry, lambda: make(generations), storage, harness, keys,
                           saved)
        except RegistryError as exc:
            assert isinstance(step.expect, Refused), f"{where}: unexpected refusal {exc.code}: {exc}"
            _check_refusal(exc, step.expect, where)
            continue
        assert not isinstance(step.expect, Refused), f"{where}: expected {step.expect}, got {got}"
        if step.expect is not None:
            expect = list(step.expect) if step.op == "verify" else step.expect
            assert got == expect, f"{where}: expected {expect}, got {got}"


def _edit(storage: Storage, harness: Harness, a: dict[str, Any]) -> None:
    record = storage.read_version(a["tool"], a["version"])
    record["manifest"].update(a["changes"])
    harness.overwrite_version(storage, a["tool"], a["version"], record)


def _swap(storage: Storage, harness: Harness, a: dict[str, Any]) -> None:
    tool, source, target = a["tool"], a["from"], a["to"]
    signature = storage.read_version(tool, source)["signature"]
    record = storage.read_version(tool, target)
    record["signature"] = signature
    harness.overwrite_version(storage, tool, target, record)
    index = storage.read_index()
    for entry in index["tools"][tool]:
        if entry["version"] == target:
            entry["signature"] = signature
    harness.overwrite_index(storage, index)
