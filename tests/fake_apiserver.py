"""A fake API server in this process: EffectLedgers and Leases of one namespace.

It keeps objects the way the API server does where Unwind's stores depend on it: a create
is atomic (409 when the name exists) and ignores status; an update of the status
subresource (a PUT, or a JSON patch that sets ``metadata.resourceVersion``) carrying a
resourceVersion is refused with 409 when the object changed since, and changes only the
status; an update of the main resource changes the spec (a new spec bumps
``metadata.generation``) and never the status; a delete honours its uid / resourceVersion
preconditions. Every object gets a fresh resourceVersion at each write.

Used by the gateway's cluster round-trip tests (``FakeClient``: each request takes a
little time, logged) and by the simulation (``tests/sim``, which sends requests through
its own scheduler).
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any
from urllib.parse import unquote

from unwind.ledger.entry import Entry


def _pointer(path: str) -> list[str]:
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    doc = copy.deepcopy(doc)
    for op in ops:
        *parents, last = _pointer(op["path"])
        target = doc
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if op["op"] == "test":
            value = target[int(last)] if isinstance(target, list) else target[last]
            if value != op["value"]:
                raise ValueError("test failed")
        elif isinstance(target, list):
            if last == "-":
                target.append(op["value"])
            elif op["op"] == "add":
                target.insert(int(last), op["value"])
            else:
                target[int(last)] = op["value"]
        else:
            if op["op"] == "replace" and last not in target:
                raise ValueError(f"replace of a missing {op['path']}")
            target[last] = op["value"]
    return doc


class FakeApiServer:
    """EffectLedgers and Leases of one namespace, shared by every gateway of a test."""

    def __init__(self, delay: float = 0.005, namespace: str = "agents") -> None:
        self.delay, self.namespace = delay, namespace
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}  # (kind, name) -> object
        self.rv = 100
        self.log: list[tuple[str, ...]] = []  # ("start"|"end", n, method, path) / ("upstream", key)
        self.bodies: list[tuple[str, str, bytes]] = []
        self._n = 0

    def client(self) -> FakeClient:
        return FakeClient(self)

    def _next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def ledger(self, name: str) -> dict[str, Any] | None:
        return self.objects.get(("effectledgers", name))

    def entries(self, run: str) -> list[Entry]:
        out: list[Entry] = []
        name: str | None = run
        while name is not None:
            obj = self.ledger(name)
            if obj is None:
                break
            status = obj.get("status") or {}
            out += [Entry.model_validate(e) for e in status.get("entries") or []]
            name = status.get("next")
        return out

    def requests_between(self, first: int, last: int) -> list[tuple[str, str]]:
        return [(e[2], e[3]) for e in self.log[first:last] if e[0] == "start"]

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        path = path.partition("?")[0]
        parts = [unquote(p) for p in path.strip("/").split("/")]
        # /apis/<group>/<version>/namespaces/<ns>/<kind>[/<name>[/status]]
        kind = parts[5]
        name = parts[6] if len(parts) > 6 else None
        sub = parts[7] if len(parts) > 7 else None
        key = (kind, name or "")
        current = self.objects.get(key)
        if method == "GET" and name is None:
            items = [o for (k, _), o in self.objects.items() if k == kind]
            return 200, {"items": copy.deepcopy(items)}
        if method == "GET":
            return (404, {"message": "not found"}) if current is None else (200, copy.deepcopy(current))
        if method == "POST":
            assert body is not None
            name = body["metadata"]["name"]
            if (kind, name) in self.objects:
                return 409, {"message": "AlreadyExists"}
            obj = copy.deepcopy(body)
            obj.pop("status", None)  # a create ignores status (the subresource is on)
            obj["metadata"].update(resourceVersion=self._next_rv(), uid=f"uid-{self.rv}",
                                   namespace=self.namespace, generation=1,
                                   creationTimestamp="2026-12-02T16:00:00Z")
            self.objects[(kind, name)] = obj
            return 201, copy.deepcopy(obj)
        if current is None:
            return 404, {"message": "not found"}
        if method == "DELETE":
            pre = (body or {}).get("preconditions") or {}
            meta = current["metadata"]
            if pre.get("uid") not in (None, meta["uid"]) or \
                    pre.get("resourceVersion") not in (None, meta["resourceVersion"]):
                return 409, {"message": "precondition failed"}
            del self.objects[key]
            return 200, {"status": "Success"}
        if method == "PUT":
            new = body
        elif method == "PATCH":
            new = json_patch(current, body)
        else:
            return 405, {"message": method}
        wanted = new["metadata"].get("resourceVersion")
        if wanted and wanted != current["metadata"]["resourceVersion"]:
            return 409, {"message": "the object has been modified"}
        obj = copy.deepcopy(current)
        if sub == "status":  # the status subresource changes only the status
            obj["status"] = copy.deepcopy(new.get("status"))
        else:  # the main resource changes everything but the status; a new spec, a generation
            assert sub is None, (method, path)
            if new.get("spec") != current.get("spec"):
                obj["metadata"]["generation"] = int(current["metadata"].get("generation", 1)) + 1
            obj["spec"] = copy.deepcopy(new.get("spec"))
            for field in ("labels", "annotations"):
                if field in new["metadata"]:
                    obj["metadata"][field] = copy.deepcopy(new["metadata"][field])
        obj["metadata"]["resourceVersion"] = self._next_rv()
        self.objects[key] = obj
        return 200, copy.deepcopy(obj)


class FakeClient:
    """One gateway's connection: the ``Api`` the store and the locks use."""

    def __init__(self, server: FakeApiServer) -> None:
        self.server = server

    async def request(self, method: str, path: str, body: Any = None, *,
                      content_type: str = "application/json",
                      accept: str = "application/json") -> tuple[int, Any]:
        s = self.server
        s._n += 1
        n = str(s._n)
        s.log.append(("start", n, method, path.partition("?")[0]))
        if body is not None:
            s.bodies.append((method, path, json.dumps(body, separators=(",", ":")).encode()))
        await asyncio.sleep(s.delay / 2)
        answer = s.handle(method, path, copy.deepcopy(body))
        await asyncio.sleep(s.delay / 2)
        s.log.append(("end", n, method, path.partition("?")[0]))
        return answer
