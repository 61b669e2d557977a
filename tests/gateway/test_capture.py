"""Capturing the state a call changes (issue 19 #1): an update undone to its old value.

The enforcement path in-process (``Gateway.call``) over the in-memory ledger, against a
small customer API served in the test (aiohttp): ``update_customer`` PATCHes an email,
its capture ``get_customer`` reads the customer first, and its inverse writes back
``$before.email``. The rollback is planned from the ledger alone and run by the step runner
that Jobs and ``unwind rollback`` use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from unwind.gateway.catalogue import LocalCatalogue
from unwind.gateway.enforce import CallRequest, CallResult, Gateway, Settings
from unwind.ledger.entry import REDACTED, Entry
from unwind.ledger.memory import MemoryLocks, MemoryStore
from unwind.ledger.plan import Step, Versions, make_plan
from unwind.ledger.stepinput import step_input
from unwind.undo.runner import parse_step, run_step
from unwind.upstream.client import Upstream
from unwind.upstream.secrets import LocalSecrets

MANIFESTS = """
- tool: crm.update_customer
  effect: reversible
  permission: crm:write
  upstream: {{ url: "{base}/customers/{{{{args.id}}}}", method: PATCH }}
  capture: {{ tool: crm.get_customer, arguments: {{ id: $args.id }} }}
  audit: {{ redaction: [$before.phone] }}
  compensation:
    tool: crm.restore_customer
    kind: inverse
    argument_map: {{ id: $args.id, email: $before.email }}
    verification:
      tool: crm.get_customer
      arguments: {{ id: $args.id }}
      expect: {{ email: $before.email }}
      retries: 1
      backoff_ms: 0
- tool: crm.get_customer
  effect: read_only
  permission: crm:write
  upstream: {{ url: "{base}/customers/{{{{args.id}}}}", method: GET }}
- tool: crm.restore_customer
  effect: idempotent
  permission: crm:write
  upstream: {{ url: "{base}/customers/{{{{args.id}}}}", method: PATCH }}
"""


class Crm:
    """Customers by id; every request is counted as (method, id)."""

    def __init__(self) -> None:
        self.customers: dict[str, dict[str, Any]] = {
            "c1": {"id": "c1", "email": "old@example.com", "phone": "+1 555 0100", "plan": "pro"}}
        self.requests: list[tuple[str, str]] = []
        self.get_status = 200

    async def get(self, request: web.Request) -> web.Response:
        cid = request.match_info["id"]
        self.requests.append(("GET", cid))
        if self.get_status != 200:
            return web.json_response({"error": "unavailable"}, status=self.get_status)
        if cid not in self.customers:
            return web.json_response({"error": "no such customer"}, status=404)
        return web.json_response(self.customers[cid])

    async def patch(self, request: web.Request) -> web.Response:
        cid = request.match_info["id"]
        self.requests.append(("PATCH", cid))
        body = await request.json()
        customer = self.customers[cid]
        customer.update({k: v for k, v in body.items() if k != "id"})
        return web.json_response(customer)

    def patches(self) -> int:
        return sum(1 for method, _ in self.requests if method == "PATCH")


class RecordingStore(MemoryStore):
    """The in-memory ledger, keeping each entry as it was first written (the write-ahead)."""

    def __init__(self) -> None:
        super().__init__()
        self.written_ahead: list[Entry] = []

    async def create(self, run: str, entry: Entry, **kw: Any) -> Entry:
        self.written_ahead.append(entry.model_copy(deep=True))
        return await super().create(run, entry, **kw)


@pytest.fixture
async def crm() -> AsyncIterator[tuple[Crm, str]]:
    state = Crm()
    app = web.Application()
    app.add_routes([web.get("/customers/{id}", state.get),
                    web.patch("/customers/{id}", state.patch)])
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield state, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


class World:
    def __init__(self, tmp_path: Path, base: str) -> None:
        (tmp_path / "crm.yaml").write_text(MANIFESTS.format(base=base))
        self.catalogue = LocalCatalogue([tmp_path / "crm.yaml"])
        assert self.catalogue.ready, self.catalogue.problem
        self.store = RecordingStore()
        self.upstream = Upstream()
        self.gateway = Gateway(self.catalogue, self.store, MemoryLocks(), self.upstream,
                               LocalSecrets(environ={}),
                               Settings(scopes=frozenset({"*"}), actor="agent"))

    async def call(self, tool: str, arguments: dict[str, Any], entry_id: str) -> CallResult:
        return await self.gateway.call(CallRequest(tool, arguments, "run-1", entry_id))

    def entry(self, entry_id: str) -> Entry:
        return self.store.runs["run-1"][entry_id]

    def versions(self) -> Versions:
        served = self.catalogue.tools()
        return Versions({s.checksum: s.manifest for s in served},
                        {s.manifest.tool: s.manifest for s in served})

    def plan(self) -> list[Step]:
        entries = list(self.store.runs["run-1"].values())
        return list(make_plan("run-1", entries, self.versions(), now=datetime.now(UTC)).steps)

    async def undo(self, step: Step) -> dict[str, Any]:
        spec = step_input("run-1", step, self.entry(step.entry), self.versions(), identity="t")
        return await run_step(parse_step(spec), self.upstream, LocalSecrets(environ={}))


@pytest.fixture
async def world(tmp_path: Path, crm: tuple[Crm, str]) -> AsyncIterator[World]:
    w = World(tmp_path, crm[1])
    try:
        yield w
    finally:
        await w.upstream.aclose()


UPDATE = {"id": "c1", "email": "new@example.com"}


async def test_an_update_is_undone_to_the_value_it_overwrote(
        world: World, crm: tuple[Crm, str]) -> None:
    api, _ = crm
    answer = await world.call("crm.update_customer", UPDATE, "u-1")
    assert answer.status == 200, answer.body
    assert api.requests == [("GET", "c1"), ("PATCH", "c1")]  # the capture ran first
    # the report tells the agent how the call is undone: with the value it overwrote
    assert answer.report is not None
    assert answer.report["undo"] == {"kind": "inverse", "tool": "crm.restore_customer",
                                     "arguments": {"id": "c1", "email": "old@example.com"}}

    # written ahead: the pending entry already holds the captured value, and only the
    # paths the undo names (not the phone, not the plan)
    [pending] = world.store.written_ahead
    assert pending.state == "pending"
    assert pending.handle is not None and pending.handle.before == {"email": "old@example.com"}
    done = world.entry("u-1")
    assert done.state == "succeeded"
    assert done.handle is not None and done.handle.before == {"email": "old@example.com"}
    assert done.handle.result == {"email": "new@example.com"}  # what the call left
    assert done.to_json()["handle"]["before"] == {"email": "old@example.com"}  # evidence, ledger

    [step] = world.plan()
    assert (step.action, step.undo_tool) == ("inverse", "crm.restore_customer")
    assert step.arguments == {"id": "c1", "email": "old@example.com"}
    assert "as crm.get_customer read it before the call" in step.reason
    assert "first checks that email still holds what the call left" in step.reason
    assert step.verification is not None
    assert step.verification.expect == {"email": "old@example.com"}

    result = await world.undo(step)
    assert (result["ok"], result["outcome"]) == (True, "undone"), result
    assert api.customers["c1"]["email"] == "old@example.com"
    assert api.customers["c1"]["phone"] == "+1 555 0100"


async def test_an_email_changed_by_someone_else_after_the_call_is_not_overwritten(
        world: World, crm: tuple[Crm, str]) -> None:
    api, _ = crm
    assert (await world.call("crm.update_customer", UPDATE, "u-1")).status == 200
    api.customers["c1"]["email"] = "support-fixed@example.com"  # a later change by a person
    patches = api.patches()

    [step] = world.plan()
    result = await world.undo(step)
    assert (result["ok"], result["outcome"], result["entry_state"]) == \
        (False, "diverged", "undo_failed"), result
    assert result["first_mismatch"] == ('email is "support-fixed@example.com", the call left '
                                        '"new@example.com"')
    assert "was not called" in result["reason"]
    assert api.patches() == patches  # nothing restored over the later change
    assert api.customers["c1"]["email"] == "support-fixed@example.com"


async def test_a_state_already_restored_counts_as_undone_without_a_second_write(
        world: World, crm: tuple[Crm, str]) -> None:
    api, _ = crm
    assert (await world.call("crm.update_customer", UPDATE, "u-1")).status == 200
    api.customers["c1"]["email"] = "old@example.com"  # an undo applied, its outcome lost
    patches = api.patches()
    [step] = world.plan()
    result = await world.undo(step)
    assert (result["ok"], result["outcome"]) == (True, "undone"), result
    assert api.patches() == patches


async def test_a_dry_run_captures_nothing_and_reports_the_undo_it_can_know(
        world: World, crm: tuple[Crm, str]) -> None:
    api, _ = crm
    answer = await world.gateway.call(CallRequest("crm.update_customer", UPDATE, "run-1", "d-1",
                                                  dry_run=True))
    assert answer.status == 200
    assert answer.body["would_run"] is True
    assert answer.body["report"]["undo"]["arguments"] == {"id": "c1"}
    assert api.requests == []


@pytest.mark.parametrize("status", [404, 500])
async def test_a_capture_that_fails_refuses_the_call_and_sends_nothing(
        world: World, crm: tuple[Crm, str], status: int) -> None:
    api, _ = crm
    api.get_status = status
    answer = await world.call("crm.update_customer", UPDATE, "u-1")
    assert answer.status == 502
    assert answer.body["error"]["code"] == "upstream_error"
    assert answer.body["error"]["capture"] == "crm.get_customer"
    assert f"answered {status}" in answer.body["error"]["message"]
    assert api.patches() == 0
    assert world.entry("u-1").state == "refused"


async def test_a_capture_without_the_value_the_undo_needs_refuses_the_call(
        world: World, crm: tuple[Crm, str]) -> None:
    api, _ = crm
    del api.customers["c1"]["email"]
    answer = await world.call("crm.update_customer", UPDATE, "u-1")
    assert answer.status == 502
    assert "compensation.argument_map.email reads $before.email" in answer.body["error"]["message"]
    assert api.patches() == 0


async def test_a_call_whose_capture_cannot_be_filled_is_a_400_and_reads_nothing(
        world: World, crm: tuple[Crm, str]) -> None:
    api, _ = crm
    answer = await world.call("crm.update_customer", {"email": "new@example.com"}, "u-1")
    assert answer.status == 400
    assert answer.body["error"]["code"] == "validation_error"
    assert api.requests == []


async def test_a_redacted_captured_value_is_masked_in_the_entry(
        tmp_path: Path, crm: tuple[Crm, str]) -> None:
    """$before paths obey audit.redaction like $args and $result: a captured value the undo
    reads at a redacted path is stored masked (and that undo is then unavailable)."""
    _, base = crm
    text = MANIFESTS.replace("email: $before.email }}\n    verification",
                             "email: $before.email, phone: $before.phone }}\n    verification")
    assert text != MANIFESTS
    (tmp_path / "crm.yaml").write_text(text.format(base=base))
    w = World.__new__(World)
    w.catalogue = LocalCatalogue([tmp_path / "crm.yaml"])
    assert w.catalogue.ready, w.catalogue.problem
    w.store, w.upstream = RecordingStore(), Upstream()
    w.gateway = Gateway(w.catalogue, w.store, MemoryLocks(), w.upstream, LocalSecrets(environ={}),
                        Settings(scopes=frozenset({"*"}), actor="agent"))
    try:
        assert (await w.call("crm.update_customer", UPDATE, "u-1")).status == 200
        handle = w.entry("u-1").handle
        assert handle is not None
        assert handle.before == {"email": "old@example.com", "phone": REDACTED}
        [step] = w.plan()
        assert step.action == "unrecoverable"
        assert "$before.phone" in step.reason
    finally:
        await w.upstream.aclose()


async def test_a_lost_answer_found_by_the_lookup_keeps_the_captured_state(
        world: World, crm: tuple[Crm, str]) -> None:
    """The pending entry holds the capture; the lookup completes the handle from what it
    finds and keeps ``before``, so the found entry is undone to the old value."""
    api, _ = crm
    api.customers["c1"]["email"] = "new@example.com"  # the call acted; its answer was lost
    served = {s.manifest.tool: s.manifest for s in world.catalogue.tools()}
    spec = {"version": 1, "ledger": "run-1",
            "step": {"entry": "u-1", "tool": "crm.update_customer", "action": "lookup",
                     "undo_tool": "crm.get_customer", "arguments": {"id": "c1"}, "residue": [],
                     "requires_approval": False, "reason": "its answer was lost"},
            "idempotency_key": None,
            "manifest": served["crm.get_customer"].canonical_dict(),
            "verification": None, "timeout_ms": None,
            "effect": {"manifest": served["crm.update_customer"].canonical_dict(),
                       "handle": {"args": {"id": "c1"}, "result": {},
                                  "before": {"email": "old@example.com"}}}}
    result = await run_step(parse_step(spec), world.upstream, LocalSecrets(environ={}))
    assert result["outcome"] == "found", result
    assert result["handle"] == {"args": {"id": "c1"}, "result": {"email": "new@example.com"},
                                "before": {"email": "old@example.com"}}
