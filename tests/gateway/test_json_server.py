"""Issue 19's "done when" against a REST server nobody here wrote: json-server (npm).

json-server keeps a JSON file as a REST API (``GET/PATCH/DELETE /customers/<id>``,
``POST /customers``), answers 404 ``{}`` for a record that is not there and numbers the
records it creates. The manifests below (the worked example in docs/manifests.md) are served
by ``unwind gateway``; every check reads json-server itself, never through Unwind: an email
changed through Unwind is the old one again after ``unwind rollback`` (``capture`` and
``$before``), a created record is deleted and read back absent (``absent``, ``done_statuses``),
a second rollback changes nothing, and every REST tool lists its argument schema over MCP.

Pinned to json-server 0.17.4, the last stable release: its CLI takes ``--host``/``--port``
and it answers as above. The 1.0 line is still beta (ids become strings, the CLI differs).
Installed like server-memory in test_mcp_upstream.py: into a cache folder outside the repo;
when npm cannot fetch it the test skips saying why, and under CI=true it fails instead.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from .conftest import ROOT, GatewayProc, env, free_port, start_gateway, stop, wait_for
from .installs import npm_tool

JSON_SERVER = "json-server@0.17.4"
BASE = "http://127.0.0.1:3000"   # replaced by the test's own json-server

# The worked example of docs/manifests.md ("A worked example: a REST API (json-server)").
MANIFESTS = """\
- tool: customers.get
  effect: read_only
  permission: customers:read
  description: Read one customer.
  input_schema:
    type: object
    properties:
      id: { type: integer, description: The customer's id. }
    required: [id]
  upstream: { url: "http://127.0.0.1:3000/customers/{{args.id}}", method: GET }
- tool: customers.update_email
  effect: reversible
  permission: customers:write
  owner: crm-team
  risk: { data_class: pii }
  timeout_ms: 5s
  description: Change a customer's email.
  input_schema:
    type: object
    properties:
      id: { type: integer, description: The customer's id. }
      email: { type: string, minLength: 3 }
    required: [id, email]
  upstream: { url: "http://127.0.0.1:3000/customers/{{args.id}}", method: PATCH }
  capture:
    tool: customers.get                  # the email the PATCH overwrites
    arguments: { id: $args.id }
  compensation:
    tool: customers.update_email         # its own inverse: the old email written back
    kind: inverse
    argument_map: { id: $args.id, email: $before.email }
    verification:
      tool: customers.get
      arguments: { id: $args.id }
      expect: { email: $before.email }
- tool: customers.create
  effect: reversible
  permission: customers:write
  owner: crm-team
  risk: { data_class: pii }
  timeout_ms: 5s
  description: Create a customer; json-server gives it the next id.
  input_schema:
    type: object
    properties:
      email: { type: string, minLength: 3 }
    required: [email]
  upstream: { url: "http://127.0.0.1:3000/customers", method: POST }
  compensation:
    tool: customers.delete
    kind: inverse
    argument_map: { id: $result.id }
    done_statuses: [404]                 # already gone counts as done, once the GET says 404
    verification:
      tool: customers.get
      arguments: { id: $result.id }
      absent: true                       # json-server answers 404 for a deleted record
- tool: customers.delete
  effect: idempotent
  permission: customers:write
  owner: crm-team
  risk: { data_class: pii }
  timeout_ms: 5s
  description: Delete a customer.
  input_schema:
    type: object
    properties:
      id: { type: integer, description: The customer's id. }
    required: [id]
  upstream: { url: "http://127.0.0.1:3000/customers/{{args.id}}", method: DELETE }
"""

COLOUR = re.compile(r"\x1b\[[0-9;]*m")   # json-server colours its request log
CUSTOMERS = [{"id": 1, "email": "ada@example.com"}, {"id": 2, "email": "grace@example.com"}]


@pytest.fixture(scope="session")
def json_server() -> Path:
    """json-server installed from npm into a cache folder."""
    return npm_tool(*JSON_SERVER.rsplit("@", 1), "json-server")


@dataclass
class Stack:
    url: str              # json-server, read straight
    db: Path              # the file json-server keeps
    log: Path             # json-server's request log
    manifests: Path
    gateway: GatewayProc

    def customer(self, cid: int) -> httpx2.Response:
        return httpx2.get(f"{self.url}/customers/{cid}", timeout=5)

    def requests(self) -> list[str]:
        """The requests json-server logged (``PATCH /customers/1 200 ...``), in order.

        json-server logs a request just after answering it, so the last line may not be
        written yet when its client moves on: a marker request is sent and waited for,
        and every request answered before it is then in the log."""
        mark = f"/_unwind_mark/{uuid.uuid4().hex}"
        httpx2.get(f"{self.url}{mark}", timeout=5)
        methods = ("GET ", "POST ", "PATCH ", "PUT ", "DELETE ")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            lines = [COLOUR.sub("", line).strip() for line in self.log.read_text().splitlines()]
            if any(mark in line for line in lines):
                return [line for line in lines
                        if line.startswith(methods) and "/_unwind_mark/" not in line]
            time.sleep(0.05)
        raise AssertionError(f"json-server did not log {mark}: {self.log.read_text()[-2000:]}")

    def rollback(self, run: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "unwind.cli.main", "rollback", "--ledger",
             str(self.gateway.ledger / f"{run}.json"), "-m", str(self.manifests), "--yes"],
            cwd=ROOT, env=env(), capture_output=True, text=True, timeout=120)


@pytest.fixture
def stack(json_server: Path, tmp_path: Path) -> Iterator[Stack]:
    db = tmp_path / "db.json"
    db.write_text(json.dumps({"customers": CUSTOMERS}, indent=2))
    port = free_port()
    log = tmp_path / "json-server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(json_server), "--host", "127.0.0.1", "--port", str(port),
                                 str(db)], cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(f"{url}/customers", proc, log, seconds=60)
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        (manifests / "customers.yaml").write_text(MANIFESTS.replace(BASE, url))
        gateway = start_gateway(manifests, tmp_path / "ledger", tmp_path,
                                scopes="customers:read,customers:write")
        try:
            yield Stack(url, db, log, manifests, gateway)
        finally:
            stop(gateway.proc)
    finally:
        stop(proc)


def test_the_worked_example_validates_and_lints_without_errors(tmp_path: Path) -> None:
    path = tmp_path / "customers.yaml"
    path.write_text(MANIFESTS)
    for command in (["validate", str(path)], ["lint", str(path)]):
        done = subprocess.run([sys.executable, "-m", "unwind.cli.main", *command], cwd=ROOT,
                              env=env(), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr


def test_the_docs_show_exactly_the_manifests_this_test_runs() -> None:
    text = (ROOT / "docs" / "manifests.md").read_text()
    heading = "### A worked example: a REST API (json-server)\n"
    assert text.count(heading) == 1, "one worked-example section in docs/manifests.md"
    section = text.split(heading, 1)[1].split("\n#", 1)[0]
    blocks = re.findall(r"^```yaml\n(.*?)^```", section, re.M | re.S)
    assert blocks == [MANIFESTS], "docs/manifests.md's worked example differs from MANIFESTS"


def test_a_json_server_record_updated_through_unwind_has_its_old_email_back_after_rollback(
        stack: Stack) -> None:
    r = stack.gateway.call("customers.update_email", {"id": 1, "email": "ada@evil.example"},
                           run="run-update")
    assert r.status_code == 200, r.text
    assert stack.customer(1).json() == {"id": 1, "email": "ada@evil.example"}

    done = stack.rollback("run-update")
    assert done.returncode == 0, done.stdout + done.stderr
    assert stack.customer(1).json() == {"id": 1, "email": "ada@example.com"}   # read straight
    assert json.loads(stack.db.read_text())["customers"] == CUSTOMERS
    [entry] = stack.gateway.entries("run-update")
    assert entry["state"] == "undone", entry
    # the undo was one PATCH, after reading the state the call left
    writes = [line for line in stack.requests() if not line.startswith("GET ")]
    assert [w.split()[:3] for w in writes] == [["PATCH", "/customers/1", "200"]] * 2, writes


def test_a_created_record_is_deleted_read_back_absent_and_a_second_rollback_changes_nothing(
        stack: Stack) -> None:
    r = stack.gateway.call("customers.create", {"email": "linus@example.com"}, run="run-create")
    assert r.status_code == 200, r.text
    created = stack.customer(3)
    assert created.status_code == 200 and created.json()["email"] == "linus@example.com"

    done = stack.rollback("run-create")
    assert done.returncode == 0, done.stdout + done.stderr
    tail = [line.split()[:3] for line in stack.requests()][-2:]
    assert tail == [["DELETE", "/customers/3", "200"], ["GET", "/customers/3", "404"]], tail
    assert stack.customer(3).status_code == 404                                # read straight
    assert json.loads(stack.db.read_text())["customers"] == CUSTOMERS
    [entry] = stack.gateway.entries("run-create")
    assert entry["state"] == "undone", entry

    ledger = stack.gateway.ledger / "run-create.json"
    kept, db, seen = ledger.read_bytes(), stack.db.read_bytes(), len(stack.requests())
    again = stack.rollback("run-create")
    assert again.returncode == 0, again.stdout + again.stderr
    assert ledger.read_bytes() == kept
    assert stack.db.read_bytes() == db
    assert stack.requests()[seen:] == []          # json-server was not even asked


def test_a_record_someone_else_deleted_first_converges_on_its_404(stack: Stack) -> None:
    r = stack.gateway.call("customers.create", {"email": "ken@example.com"}, run="run-gone")
    assert r.status_code == 200, r.text
    assert httpx2.delete(f"{stack.url}/customers/3", timeout=5).status_code == 200

    done = stack.rollback("run-gone")
    assert done.returncode == 0, done.stdout + done.stderr
    [entry] = stack.gateway.entries("run-gone")
    assert entry["state"] == "undone", entry
    tail = [line.split()[:3] for line in stack.requests()][-2:]
    assert tail == [["DELETE", "/customers/3", "404"], ["GET", "/customers/3", "404"]], tail


async def test_every_rest_tool_lists_its_argument_schema_over_mcp(stack: Stack) -> None:
    async with httpx2.AsyncClient(headers={"X-Unwind-Run": "run-list"}, timeout=30) as http, \
            Client(streamable_http_client(f"{stack.gateway.url}/mcp", http_client=http)) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
    wanted: dict[str, Any] = {
        "customers__get": ["id"], "customers__update_email": ["id", "email"],
        "customers__create": ["email"], "customers__delete": ["id"]}
    assert set(tools) == set(wanted)
    for name, required in wanted.items():
        schema = tools[name].input_schema
        assert schema["type"] == "object" and schema["required"] == required, (name, schema)
        assert set(schema["properties"]) == set(required), (name, schema)
