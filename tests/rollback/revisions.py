"""A document store with revisions, as CouchDB keeps them, in memory; the manifests of its
create, update and delete tools; and a run recorded the way the gateway records it.

Each document has a revision that changes on every write; an update or a delete that names
a stale revision is refused (409), as CouchDB (and every API with ETags) refuses it. The
manifests undo through ``compensation.current`` (the revision right before the undo) and
``If-Match``; the update's divergence check compares with the read made right after the
call (``verification.after_call``), since the update's answer (``{ok, id, rev}``) holds none
of its fields. Used by the property test of order by object (test_object_order.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from unwind.ledger.entry import Entry, Times, stamp
from unwind.ledger.handle import after_tree, build_handle
from unwind.ledger.plan import Versions
from unwind.manifest.canonical import checksum
from unwind.manifest.model import ToolManifest
from unwind.manifest.validate import validate_manifest, validate_set
from unwind.upstream.client import Answer, Prepared, Upstream

BASE = "http://docs.test/docs/{{args.id}}"


def _m(data: dict[str, Any]) -> ToolManifest:
    m, issues = validate_manifest(data)
    assert m is not None and not issues, issues
    return m


GET = {"tool": "docs.get", "effect": "read_only", "permission": "docs:read",
       "upstream": {"url": BASE, "method": "GET"}}
RESTORE = {"tool": "docs.restore", "effect": "idempotent", "permission": "docs:write",
           "upstream": {"url": BASE, "method": "PUT"}}
REMOVE = {"tool": "docs.remove", "effect": "idempotent", "permission": "docs:write",
          "upstream": {"url": BASE, "method": "DELETE"}}
CURRENT = {"tool": "docs.get", "arguments": {"id": "$args.id"}}
CREATE = {"tool": "docs.create", "effect": "reversible", "permission": "docs:write",
          "upstream": {"url": BASE, "method": "PUT"},
          "compensation": {"kind": "inverse", "tool": "docs.remove",
                           "argument_map": {"id": "$args.id"}, "current": CURRENT,
                           "headers": {"If-Match": "$current._rev"},
                           "verification": {"tool": "docs.get", "arguments": {"id": "$args.id"},
                                            "absent": True, "backoff_ms": 0}}}
UPDATE = {"tool": "docs.update", "effect": "reversible", "permission": "docs:write",
          "upstream": {"url": BASE, "method": "PUT"},
          "capture": {"tool": "docs.get", "arguments": {"id": "$args.id"}},
          "compensation": {"kind": "inverse", "tool": "docs.restore",
                           "argument_map": {"id": "$args.id", "title": "$before.title",
                                            "_rev": "$current._rev"},
                           "current": CURRENT,
                           "verification": {"tool": "docs.get", "arguments": {"id": "$args.id"},
                                            "expect": {"title": "$before.title"},
                                            "after_call": True, "backoff_ms": 0}}}
DELETE = {"tool": "docs.delete", "effect": "reversible", "permission": "docs:write",
          "upstream": {"url": BASE, "method": "DELETE"},
          "capture": {"tool": "docs.get", "arguments": {"id": "$args.id"}},
          "compensation": {"kind": "inverse", "tool": "docs.restore",
                           "argument_map": {"id": "$args.id", "title": "$before.title"},
                           "verification": {"tool": "docs.get", "arguments": {"id": "$args.id"},
                                            "expect": {"title": "$before.title"},
                                            "backoff_ms": 0}}}
MANIFESTS = [_m(d) for d in (GET, RESTORE, REMOVE, CREATE, UPDATE, DELETE)]
assert validate_set(MANIFESTS) == []
TOOLS = {m.tool: m for m in MANIFESTS}
VERSIONS = Versions({checksum(m): m for m in MANIFESTS}, TOOLS)


@dataclass
class Docs:
    """The store: id -> {title, _rev}; every write bumps the revision."""

    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: int = 0

    def state(self) -> dict[str, str]:
        return {k: v["title"] for k, v in self.docs.items()}

    def _rev(self, doc_id: str) -> str:
        self.writes += 1
        return f"{self.writes}-{doc_id}"

    def handle(self, tool: str, doc_id: str, args: dict[str, Any],
               headers: dict[str, str]) -> tuple[int, Any]:
        doc = self.docs.get(doc_id)
        if tool == "docs.get":
            return (200, {"_id": doc_id, **copy.deepcopy(doc)}) if doc else (404, {"error": "not_found"})
        if tool == "docs.create":
            if doc is not None:
                return 409, {"error": "conflict"}
        elif tool in ("docs.update", "docs.delete", "docs.remove"):
            if doc is None:
                return 404, {"error": "not_found"}
            given = args.get("_rev") or headers.get("If-Match")
            if given != doc["_rev"]:
                return 409, {"error": "conflict", "reason": "Document update conflict"}
        elif tool == "docs.restore" and doc is not None and args.get("_rev") != doc["_rev"]:
            return 409, {"error": "conflict", "reason": "Document update conflict"}
        if tool in ("docs.delete", "docs.remove"):
            del self.docs[doc_id]
            return 200, {"ok": True, "id": doc_id, "rev": self._rev(doc_id)}
        rev = self._rev(doc_id)
        self.docs[doc_id] = {"title": args["title"], "_rev": rev}
        return 201, {"ok": True, "id": doc_id, "rev": rev}


class DocsUpstream(Upstream):
    """The step runner's client, answered by the store (no network)."""

    def __init__(self, docs: Docs) -> None:
        super().__init__()
        self.docs = docs

    async def send(self, p: Prepared) -> Answer:
        doc_id = p.url.rsplit("/", 1)[-1]
        status, data = self.docs.handle(p.manifest.tool, doc_id, dict(p.arguments), p.headers)
        return Answer("ok" if status < 300 else "error_status", status, data)


T0 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


def record(docs: Docs, ops: list[tuple[str, str, str]], clocks: list[int]) -> list[Entry]:
    """Make the run's calls against ``docs`` as the gateway would (capture, call, read
    after), and the entries it would record. ``clocks[i]``: the second (of some gateway's
    clock) entry i says it started at; two gateways' clocks may disagree with the order
    the calls were made in."""
    entries = []
    for i, (kind, doc_id, title) in enumerate(ops):
        m = TOOLS[f"docs.{kind}"]
        args: dict[str, Any] = {"id": doc_id}
        before = None
        if m.capture is not None:
            before = docs.handle("docs.get", doc_id, {}, {})[1]
        if kind in ("create", "update"):
            args["title"] = title
        if kind in ("update", "delete"):
            args["_rev"] = docs.docs[doc_id]["_rev"]
        status, result = docs.handle(m.tool, doc_id, args, {})
        assert status < 300, (kind, doc_id, result)
        handle = build_handle(m, args, result, strict=True, before=before)
        v = m.compensation.verification if m.compensation else None
        if v is not None and v.after_call:
            handle = handle.model_copy(update={"after": after_tree(
                m, docs.handle("docs.get", doc_id, {}, {})[1])})
        when = stamp(T0 + timedelta(seconds=clocks[i]))
        entries.append(Entry(id=f"e-{i + 1}", seq=i + 1, tool=m.tool, checksum=checksum(m),
                             effect=m.effect, actor="agent", state="succeeded", handle=handle,
                             times=Times(requested=when, started=when, finished=when)))
    return entries
