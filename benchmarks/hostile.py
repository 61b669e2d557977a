"""Benchmark: what hostile inputs cost now (issue 29), each beside a baseline of the same
size measured in the same run.

    python -m benchmarks.hostile

1. ``unwind manifests scaffold --from-openapi`` of a 2.8 KiB document whose components each
   name the one below six times (6^10 copies when inlined), beside a document of the same
   components naming nothing: wall time and peak RSS of the command (a process each).
2. The argument check the gateway runs at both doors (``gateway/schemas.py``): an ordinary
   call against a closed schema (the check, and the undeclared-argument walk), beside the
   ``jsonschema`` library's own validator on the same schema and call; then a hostile call
   (a recursion that branches at every level) until it is refused, on the worker thread.
3. A gateway process starting on an MCP upstream that lists 30 pages of 3.5 MiB, and 30 of
   900 KiB, beside one listing one small page: the gateway's peak RSS (the sidecar's limit
   is 128 Mi).
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _scaffold(doc: dict[str, Any], folder: Path) -> tuple[float, int]:
    path = folder / "api.json"
    path.write_text(json.dumps(doc, separators=(",", ":")))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "unwind.cli.main", "manifests", "scaffold",
                           "--from-openapi", str(path), "--dir", str(folder / "out")],
                          capture_output=True, text=True, timeout=300)
    took = time.perf_counter() - started
    assert done.returncode == 0, done.stderr
    return took, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def components(levels: int, width: int, fan: bool) -> dict[str, Any]:
    schemas: dict[str, Any] = {"S0": {"type": "string"}}
    for i in range(1, levels + 1):
        below = {"$ref": f"#/components/schemas/S{i - 1}"} if fan else {"type": "string"}
        schemas[f"S{i}"] = {"properties": {chr(97 + k): below for k in range(width)}}
    return {"openapi": "3.0.3", "info": {"title": "b", "version": "1"},
            "servers": [{"url": "https://api.example.com"}], "components": {"schemas": schemas},
            "paths": {"/things": {"post": {"operationId": "createThing", "requestBody": {
                "content": {"application/json": {"schema": {
                    "$ref": f"#/components/schemas/S{levels}"}}}}}}}}


def scaffold_part() -> None:
    print("1. scaffold --from-openapi (a process each; peak RSS is the largest child so far)")
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        flat_s, flat_rss = _scaffold(components(10, 6, fan=False), Path(a))
        fan_s, fan_rss = _scaffold(components(10, 6, fan=True), Path(b))
    print(f"   baseline: 2.8 KiB, references naming nothing   {flat_s:6.2f} s  {flat_rss / 1024:5.0f} MiB")
    print(f"   2.8 KiB fanning out 6^10 (the issue's case)     {fan_s:6.2f} s  {fan_rss / 1024:5.0f} MiB")


def check_part() -> None:
    from jsonschema import Draft202012Validator

    from unwind.gateway.schemas import _problems
    from unwind.manifest.model import ToolManifest
    from unwind.manifest.schema_work import MAX_STEPS, TooMuchWork

    schema = {"type": "object", "required": ["id", "email"], "properties": {
        "id": {"type": "string"}, "email": {"type": "string", "pattern": "^[^@]+@[^@]+$"}}}
    m = ToolManifest.model_validate({"tool": "c.update", "effect": "idempotent",
                                     "permission": "p", "input_schema": schema})
    call = {"id": "c1", "email": "a@example.com"}
    plain = Draft202012Validator(schema)
    n = 20_000
    _problems(m, schema, call, 2_000, None)
    started = time.perf_counter()
    for _ in range(n):
        list(plain.iter_errors(call))
    base = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for _ in range(n):
        _problems(m, schema, call, 2_000, None)
    ours = (time.perf_counter() - started) / n
    print("2. the argument check of one call")
    print(f"   baseline: jsonschema's validator alone          {base * 1e6:7.1f} us")
    print(f"   the gateway's check (bounded, RE2, undeclared)  {ours * 1e6:7.1f} us")
    tree = {"type": "object", "properties": {"tree": {"$ref": "#/$defs/t"}}, "$defs": {"t": {
        "anyOf": [{"type": "array", "items": {"$ref": "#/$defs/t"}},
                  {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/t"}}]}}}
    value: Any = "leaf"
    for _ in range(40):
        value = [value]
    started = time.perf_counter()
    try:
        _problems(m, tree, {"tree": value}, MAX_STEPS, time.monotonic() + 2.0)
    except TooMuchWork as exc:
        print(f"   a hostile call (2^40 paths) refused after       {time.perf_counter() - started:7.2f} s  ({exc})")


def listing_part() -> None:
    import importlib

    sys.path.insert(0, str(ROOT))  # the tests' hostile server and gateway harness, by name
    conftest = importlib.import_module("tests.gateway.conftest")
    listings = importlib.import_module("tests.gateway.test_attacks_listings")
    start_gateway, stop = conftest.start_gateway, conftest.stop
    manifests, pages_server = listings.manifests, listings.pages_server
    peak_rss_kib = importlib.import_module("tests.gateway.test_attacks_doors").peak_rss_kib

    print("3. a gateway starting on a listing (peak RSS of the gateway process)")
    for label, args in (("baseline: 1 page of 4 KiB", ["--pages", "1", "--page-bytes", "4096"]),
                        ("30 pages of 3.5 MiB (the issue's case)",
                         ["--pages", "30", "--page-bytes", str(7 * 512 * 1024)]),
                        ("30 pages of 900 KiB", ["--pages", "30", "--page-bytes", str(900 * 1024)])):
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp)
            with pages_server(folder, *args) as url:
                gw = start_gateway(manifests(folder, url), folder / "ledger", folder, scopes="p:w")
                try:
                    peak = peak_rss_kib(gw.proc.pid)
                finally:
                    stop(gw.proc)
        print(f"   {label:<46}{peak / 1024:6.0f} MiB")


def main() -> int:
    scaffold_part()
    check_part()
    listing_part()
    return 0


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    raise SystemExit(main())
