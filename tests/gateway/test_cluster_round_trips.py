"""The cluster store's requests on a call's path, against a fake API server in this process.

The fake keeps EffectLedgers and Leases the way the API server does where it matters here:
a create is atomic (409 when the name exists), a PUT or JSON patch of the status carrying a
resourceVersion is refused with 409 when the object changed since, a delete honours its
uid / resourceVersion preconditions. Every request takes a little time (between its start
and its end, both logged beside the upstream's calls), so what goes out together, and what
goes out before the upstream is called, can be read off the log.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tests.fake_apiserver import FakeApiServer
from unwind import API_GROUP, API_VERSION
from unwind.gateway.catalogue import LocalCatalogue
from unwind.gateway.enforce import CallRequest, Gateway, Settings
from unwind.ledger.clusterstore import ClusterStore, LeaseLocks
from unwind.ledger.store import Holder, lock_name
from unwind.upstream.client import Answer, Prepared
from unwind.upstream.secrets import LocalSecrets

NS = "agents"
LEDGERS = f"/apis/{API_GROUP}/{API_VERSION}/namespaces/{NS}/effectledgers"
ACTOR = "system:serviceaccount:agents:bot"
MANIFESTS = """\
- tool: t.echo
  description: No idempotency key.
  effect: idempotent
  permission: t:write
  upstream: { url: "http://127.0.0.1:9/echo", method: POST }
- tool: t.pay
  description: Keyed by the order, sent as the Idempotency-Key header.
  effect: idempotent
  permission: t:write
  idempotency: { key: "order-{{args.order}}", scope: global, carrier: { header: Idempotency-Key } }
  upstream: { url: "http://127.0.0.1:9/pay", method: POST }
- tool: t.set
  description: Keyed, with a capture of what it changes.
  effect: compensable
  permission: t:write
  idempotency: { key: "set-{{args.id}}", scope: global, carrier: { header: Idempotency-Key } }
  capture: { tool: t.read, arguments: { id: $args.id } }
  upstream: { url: "http://127.0.0.1:9/set", method: POST }
  compensation:
    tool: t.restore
    residue: [the change was seen]
    argument_map: { id: $args.id, value: $before.value }
- tool: t.restore
  description: Puts the value back.
  effect: idempotent
  permission: t:write
  upstream: { url: "http://127.0.0.1:9/restore", method: POST }
- tool: t.read
  description: Reads what t.set changes.
  effect: read_only
  permission: t:write
  upstream: { url: "http://127.0.0.1:9/read", method: POST }
"""


class FakeUpstream:
    """Records each call it gets (its Idempotency-Key header) in the server's log."""

    def __init__(self, server: FakeApiServer, fail: bool = False) -> None:
        self.server, self.fail = server, fail
        self.schemas: dict[tuple[str, str], dict[str, Any]] = {}
        self.calls: list[dict[str, Any]] = []

    async def send(self, p: Prepared) -> Answer:
        self.server.log.append(("upstream", p.headers.get("Idempotency-Key", p.manifest.tool)))
        self.calls.append({"tool": p.manifest.tool, "headers": dict(p.headers)})
        await asyncio.sleep(0.002)
        if self.fail:
            return Answer(kind="error_status", status=400, data={"error": "no"}, text="no")
        return Answer(kind="ok", status=200, data={"ok": True, "n": len(self.calls), "value": 1})

    async def aclose(self) -> None:
        return None


@pytest.fixture
def manifests(tmp_path: Path) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(MANIFESTS)
    return path


def gateway(server: FakeApiServer, manifests: Path, upstream: FakeUpstream | None = None) -> Gateway:
    api = server.client()
    return Gateway(LocalCatalogue([manifests]), ClusterStore(api, NS), LeaseLocks(api, NS),
                   upstream or FakeUpstream(server), LocalSecrets(),  # type: ignore[arg-type]
                   Settings(scopes=frozenset({"t:write"}), actor=ACTOR))


async def test_a_keyless_call_sends_only_its_pending_write_before_the_upstream(manifests: Path) -> None:
    server = FakeApiServer()
    gw = gateway(server, manifests)
    first = await gw.call(CallRequest("t.echo", {"x": 1}, "run-1", "e-1"))  # makes the ledger
    assert first.status == 200, first.body
    start = len(server.log)
    result = await gw.call(CallRequest("t.echo", {"x": 2}, "run-1", "e-2"))
    assert result.status == 200, result.body
    at = start + next(i for i, e in enumerate(server.log[start:]) if e[0] == "upstream")
    before = server.requests_between(start, at)
    assert before == [("PATCH", f"{LEDGERS}/run-1/status")]
    after = server.requests_between(at, len(server.log))
    assert [m for m, _ in after] == ["PATCH"]  # the outcome
    assert [(e.id, e.state) for e in server.entries("run-1")] == [("e-1", "succeeded"),
                                                                   ("e-2", "succeeded")]


async def test_the_pending_write_is_only_a_patch_of_the_new_entry_on_its_resource_version(
        manifests: Path) -> None:
    server = FakeApiServer(delay=0)
    gw = gateway(server, manifests)
    for n in range(20):
        assert (await gw.call(CallRequest("t.echo", {"x": n}, "run-1", f"e-{n}"))).status == 200
    page = json.dumps(server.ledger("run-1")["status"]).encode()  # type: ignore[index]
    server.bodies.clear()
    assert (await gw.call(CallRequest("t.echo", {"x": 99}, "run-1", "e-99"))).status == 200
    pending, outcome = [json.loads(b) for m, _, b in server.bodies]
    assert pending[0] == {"op": "replace", "path": "/metadata/resourceVersion",
                          "value": pending[0]["value"]}
    assert [op["path"] for op in pending[1:]] == ["/status/entries/-", "/status/entryCount",
                                                   "/status/lastState"]
    assert [op["path"] for op in outcome[1:]] == ["/status/entries/20", "/status/entryCount",
                                                   "/status/lastState"]
    sent = sum(len(b) for _, _, b in server.bodies)
    assert sent * 4 < len(page), (sent, len(page))


async def test_a_write_on_an_old_resource_version_is_refused_and_applied_again_on_the_new_one(
        manifests: Path) -> None:
    server = FakeApiServer(delay=0)
    a, b = gateway(server, manifests), gateway(server, manifests)
    assert (await a.call(CallRequest("t.echo", {"x": 1}, "run-1", "a-1"))).status == 200
    assert (await b.call(CallRequest("t.echo", {"x": 2}, "run-1", "b-1"))).status == 200
    # a's copy of the page is one version behind: its PATCH gets 409, it reads, and writes again
    assert (await a.call(CallRequest("t.echo", {"x": 3}, "run-1", "a-2"))).status == 200
    assert [(e.id, e.seq, e.state) for e in server.entries("run-1")] == [
        ("a-1", 1, "succeeded"), ("b-1", 2, "succeeded"), ("a-2", 3, "succeeded")]


async def test_with_a_key_the_lease_and_the_pending_write_go_out_together(manifests: Path) -> None:
    server = FakeApiServer()
    gw = gateway(server, manifests)
    assert (await gw.call(CallRequest("t.echo", {"x": 1}, "run-1", "e-1"))).status == 200
    start = len(server.log)
    result = await gw.call(CallRequest("t.pay", {"order": 7}, "run-1", "e-2"))
    assert result.status == 200, result.body
    at = start + next(i for i, e in enumerate(server.log[start:]) if e[0] == "upstream")
    window = server.log[start:at]
    starts = [e for e in window if e[0] == "start"]
    assert sorted(e[2] for e in starts) == ["PATCH", "POST"]
    assert starts[1][3].endswith("/leases") or starts[0][3].endswith("/leases")
    first_end = next(i for i, e in enumerate(window) if e[0] == "end")
    assert all(window.index(e) < first_end for e in starts), window  # both out before either ends
    assert server.log[at] == ("upstream", "order-7")
    assert [(e.id, e.state) for e in server.entries("run-1")][-1] == ("e-2", "succeeded")


async def test_a_key_held_by_a_standing_call_leaves_the_pending_entry_refused_and_calls_nothing(
        manifests: Path) -> None:
    server = FakeApiServer()
    upstream = FakeUpstream(server)
    gw = gateway(server, manifests, upstream)
    assert (await gw.call(CallRequest("t.pay", {"order": 7}, "run-1", "e-1"))).status == 200
    assert len(upstream.calls) == 1
    start = len(server.log)
    again = await gw.call(CallRequest("t.pay", {"order": 7}, "run-1", "e-2"))
    assert again.status == 409 and again.body["error"]["code"] == "duplicate", again.body
    assert again.body["error"].get("entry") == "e-1"
    assert len(upstream.calls) == 1
    assert not any(e[0] == "upstream" for e in server.log[start:])
    entries = {e.id: e for e in server.entries("run-1")}
    assert entries["e-1"].state == "succeeded"
    refused = entries["e-2"]
    assert refused.state == "refused" and refused.error is not None
    assert refused.error.code == "duplicate"
    assert refused.handle is None and refused.times.finished is not None
    # the key stays e-1's: its Lease was never touched
    lease = server.objects[("leases", "unwind-key-" + lock_name(
        "global", run="run-1", actor=ACTOR, tool="t.pay", key="order-7"))]
    assert lease["spec"]["holderIdentity"] == "e-1"
    # and the refused Idempotency-Key may be used again, for a new order
    other = await gw.call(CallRequest("t.pay", {"order": 8}, "run-1", "e-2"))
    assert other.status == 200, other.body
    assert [a.state for a in {e.id: e for e in server.entries("run-1")}["e-2"].attempts] == ["refused"]


async def test_a_stale_lease_whose_entry_never_came_is_broken_and_the_call_runs(manifests: Path) -> None:
    server = FakeApiServer()
    upstream = FakeUpstream(server)
    gw = gateway(server, manifests, upstream)
    name = lock_name("global", run="run-1", actor=ACTOR, tool="t.pay", key="order-7")
    # a gateway that died between its Lease and its pending write, long ago
    await LeaseLocks(server.client(), NS).acquire(name, Holder("run-0", "gone", "2026-01-01T00:00:00.000Z"))
    result = await gw.call(CallRequest("t.pay", {"order": 7}, "run-1", "e-1"))
    assert result.status == 200, result.body
    assert len(upstream.calls) == 1
    lease = server.objects[("leases", "unwind-key-" + name)]
    assert lease["spec"]["holderIdentity"] == "e-1"


async def test_two_gateways_racing_on_one_key_call_the_upstream_once(manifests: Path) -> None:
    server = FakeApiServer(delay=0.004)
    upstream = FakeUpstream(server)
    a, b = gateway(server, manifests, upstream), gateway(server, manifests, upstream)
    for gw, run in ((a, "run-a"), (b, "run-b")):  # warm: each holds its run's page
        assert (await gw.call(CallRequest("t.echo", {"x": 0}, run, f"{run}-0"))).status == 200
    calls = [(a if n % 2 else b).call(CallRequest("t.pay", {"order": 1}, "run-a" if n % 4 < 2
                                                  else "run-b", f"k-{n}")) for n in range(20)]
    results = await asyncio.gather(*calls)
    assert sorted(r.status for r in results) == [200] + [409] * 19, [r.body for r in results]
    assert [c["headers"] for c in upstream.calls if c["tool"] == "t.pay"] == [
        {"Idempotency-Key": "order-1"}]
    entries = server.entries("run-a") + server.entries("run-b")
    keyed = [e for e in entries if e.tool == "t.pay"]
    assert sorted(e.state for e in keyed) == ["refused"] * 19 + ["succeeded"]
    assert all(e.error is not None and e.error.code == "duplicate" for e in keyed
               if e.state == "refused")


async def test_a_key_that_cannot_be_taken_leaves_the_pending_entry_refused(manifests: Path) -> None:
    server = FakeApiServer()
    upstream = FakeUpstream(server)
    gw = gateway(server, manifests, upstream)
    assert (await gw.call(CallRequest("t.echo", {"x": 1}, "run-1", "e-1"))).status == 200
    handle = server.handle

    def no_leases(method: str, path: str, body: Any) -> tuple[int, Any]:
        if "/leases" in path:
            return 403, {"message": "forbidden"}
        return handle(method, path, body)
    server.handle = no_leases  # type: ignore[method-assign]
    result = await gw.call(CallRequest("t.pay", {"order": 7}, "run-1", "e-2"))
    assert result.status == 503 and result.body["error"]["code"] == "ledger_unavailable"
    assert [c["tool"] for c in upstream.calls] == ["t.echo"]
    entry = {e.id: e for e in server.entries("run-1")}["e-2"]
    assert entry.state == "refused" and entry.error is not None
    assert entry.error.code == "ledger_unavailable"


async def test_a_pending_write_that_fails_gives_the_key_back(manifests: Path) -> None:
    server = FakeApiServer()
    upstream = FakeUpstream(server)
    gw = gateway(server, manifests, upstream)
    assert (await gw.call(CallRequest("t.echo", {"x": 1}, "run-1", "e-1"))).status == 200
    handle = server.handle

    def no_status(method: str, path: str, body: Any) -> tuple[int, Any]:
        if path.endswith("/status"):
            return 500, {"message": "etcd is gone"}
        return handle(method, path, body)
    server.handle = no_status  # type: ignore[method-assign]
    result = await gw.call(CallRequest("t.pay", {"order": 7}, "run-1", "e-2"))
    assert result.status == 503
    assert [c["tool"] for c in upstream.calls] == ["t.echo"]
    assert not [k for k in server.objects if k[0] == "leases"]  # released


async def test_an_entry_another_gateway_left_failed_runs_again_under_its_key(manifests: Path) -> None:
    """The store's copy of the run lacks the entry, the write finds it: the call is decided
    again on a fresh read, and the failed entry is reused as before."""
    server = FakeApiServer(delay=0)
    a = gateway(server, manifests, FakeUpstream(server))
    b = gateway(server, manifests, FakeUpstream(server, fail=True))
    assert (await a.call(CallRequest("t.echo", {"x": 1}, "run-1", "a-1"))).status == 200
    failed = await b.call(CallRequest("t.echo", {"x": 2}, "run-1", "retry-me"))
    assert failed.status == 422, failed.body  # the upstream's 400: upstream_rejected
    result = await a.call(CallRequest("t.echo", {"x": 2}, "run-1", "retry-me"))
    assert result.status == 200, result.body
    entry = {e.id: e for e in server.entries("run-1")}["retry-me"]
    assert entry.state == "succeeded" and [t.state for t in entry.attempts] == ["failed"]


async def test_an_entry_the_store_holds_is_read_fresh_so_an_approval_written_meanwhile_counts(
        manifests: Path) -> None:
    server = FakeApiServer(delay=0)
    gw = gateway(server, manifests)
    assert (await gw.call(CallRequest("t.echo", {"x": 1}, "run-1", "e-1"))).status == 200
    start = len(server.log)
    again = await gw.call(CallRequest("t.echo", {"x": 1}, "run-1", "e-1"))
    assert again.status == 409
    assert server.requests_between(start, len(server.log))[0] == (
        "GET", f"{LEDGERS}/run-1")


async def test_a_keyed_call_with_a_capture_takes_its_lease_then_captures_then_writes_ahead(
        manifests: Path) -> None:
    server = FakeApiServer()
    gw = gateway(server, manifests)
    assert (await gw.call(CallRequest("t.echo", {"x": 1}, "run-1", "e-1"))).status == 200
    start = len(server.log)
    result = await gw.call(CallRequest("t.set", {"id": "c1"}, "run-1", "e-2"))
    assert result.status == 200, result.body
    kinds = [(e[0], e[2] if e[0] != "upstream" else e[1]) for e in server.log[start:]
             if e[0] in ("start", "upstream")]
    assert kinds == [("start", "POST"), ("upstream", "t.read"), ("start", "PATCH"),
                     ("upstream", "set-c1"), ("start", "PATCH")], kinds
