"""The sidecar's memory budget: the gateway and the ledger never import the Kubernetes client."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .conftest import ROOT, env

PROBE = """
import sys
from unwind.cli.main import build_parser
build_parser("gateway")
import unwind.gateway.app, unwind.cli.gateway_cmds
import unwind.ledger.filestore, unwind.ledger.decide, unwind.ledger.memory
import unwind.gateway.kube, unwind.gateway.bundle_catalogue
import unwind.ledger.clusterstore, unwind.bundle
print(sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes", "kopf")))
"""


def test_the_gateway_imports_neither_the_kubernetes_client_nor_kopf_in_either_mode() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env(), capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


LAZY_MCP = """
import asyncio, json, sys
import httpx2
from unwind.gateway.app import build_app
from unwind.gateway.catalogue import LocalCatalogue
from unwind.gateway.enforce import Gateway, Settings
from unwind.ledger.memory import MemoryLocks, MemoryStore
from unwind.upstream.client import Upstream
from unwind.upstream.secrets import LocalSecrets

async def main():
    gw = Gateway(LocalCatalogue([sys.argv[1]]), MemoryStore(), MemoryLocks(), Upstream(),
                 LocalSecrets(), Settings(scopes=frozenset({"*"}), actor="me"))
    app = build_app(gw)
    seen = []
    async with app.router.lifespan_context(app):
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app),
                                      base_url="http://127.0.0.1") as http:
            ready = await http.get("/readyz")
            r = await http.post("/call/demo.read", json={"arguments": {}},
                                headers={"X-Unwind-Run": "run-1"})
            seen.append([ready.status_code, r.json()["error"]["code"],
                         any(m.startswith("mcp") for m in sys.modules)])
            r = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                headers={"Accept": "application/json, text/event-stream"})
            names = [t["name"] for t in r.json()["result"]["tools"]]
            seen.append([r.status_code, any(m.startswith("mcp") for m in sys.modules), names])
    print(json.dumps(seen))

asyncio.run(main())
"""


def test_the_mcp_sdk_is_loaded_on_the_first_mcp_request_not_before(tmp_path: Path) -> None:
    """About 27 MB of the sidecar: a gateway whose agent speaks only REST never loads it."""
    (tmp_path / "m.yaml").write_text("""- tool: demo.read
  description: Read a thing.
  effect: read_only
  permission: demo:read
  upstream: { url: "http://127.0.0.1:9/x", method: GET }
""")
    out = subprocess.run([sys.executable, "-c", LAZY_MCP, str(tmp_path / "m.yaml")], cwd=ROOT,
                         env=env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    rest, mcp = json.loads(out.stdout.strip().splitlines()[-1])
    assert rest == [200, "upstream_error", False]  # the call ran (nothing listens on :9)
    assert mcp == [200, True, ["demo__read"]]


LAZY_EXTRAS = """
import sys
import unwind.gateway.app, unwind.cli.gateway_cmds, unwind.gateway.auth.doors
import unwind.gateway.ratelimit, unwind.gateway.mcp_guard
print(sorted({m.split(".")[0] for m in sys.modules if m.split(".")[0] in ("jwt", "redis")}
             | {m for m in sys.modules if m.startswith("opentelemetry.sdk")}))
"""


def test_jose_redis_and_the_opentelemetry_sdk_are_imported_only_when_configured() -> None:
    out = subprocess.run([sys.executable, "-c", LAZY_EXTRAS], cwd=ROOT, env=env(),
                         capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
