"""Issue 29, items 4 and 7, against a hostile MCP upstream (``tests/upstream/mcp_pages.py``,
a real streamable HTTP server in a process of its own) and a real ``unwind gateway``:

- a ``tools/list`` of 30 pages of 3.5 MiB took the gateway to about 345 MiB at its start,
  and the sidecar's limit is 128 Mi: now the listing has a total budget and keeps only the
  tools some manifest names;
- a listed input schema whose ``$defs`` fan out froze the gateway on the first call: now
  it is judged unusable when listed (the tool is served, its arguments go unchecked, and
  the gateway says so in its log).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx2

from .conftest import ROOT, env, free_port, start_gateway, stop
from .test_attacks_doors import peak_rss_kib

SIDECAR_LIMIT_KIB = 128 * 1024


@contextlib.contextmanager
def pages_server(folder: Path, *args: str) -> Iterator[str]:
    port = free_port()
    log = folder / "pages.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.upstream.mcp_pages", "--port",
                                 str(port), *args], cwd=ROOT, env=env(), stdout=out,
                                stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx2.get(url, timeout=1)
                break
            except httpx2.HTTPError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield url
    finally:
        stop(proc)


def manifests(folder: Path, url: str) -> Path:
    (folder / "m").mkdir()
    (folder / "m" / "pages.yaml").write_text(json.dumps([
        {"tool": "pages.echo", "effect": "idempotent", "permission": "p:w",
         "upstream": {"mcp": {"url": url, "tool": "echo"}, "timeout_ms": 5000}}]))
    return folder / "m"


def start_listing(tmp_path: Path, url: str) -> tuple[object, int, int, int]:
    """Start a gateway on the server, then call echo twice (an argument too many, then
    right); its peak RSS (the listing is read before the gateway serves) and the answers."""
    gw = start_gateway(manifests(tmp_path, url), tmp_path / "ledger", tmp_path, scopes="p:w")
    try:
        peak = peak_rss_kib(gw.proc.pid)
        refused = gw.call("pages.echo", {"text": "hi", "extra": 1}).status_code
        served = gw.call("pages.echo", {"text": "hi"}).status_code
    finally:
        stop(gw.proc)
    return gw, peak, refused, served


def test_thirty_pages_of_3_5_mib_keep_the_gateway_well_under_the_sidecars_128_mi(
        tmp_path: Path) -> None:
    with pages_server(tmp_path, "--pages", "30", "--page-bytes", str(7 * 512 * 1024)) as url:
        gw, peak, _, served = start_listing(tmp_path, url)
    print(f"gateway peak RSS with a 30 x 3.5 MiB tools/list: {peak / 1024:.0f} MiB")
    assert peak < 0.75 * SIDECAR_LIMIT_KIB, f"{peak / 1024:.0f} MiB"
    log = gw.log.read_text()  # type: ignore[attr-defined]
    assert "answered with more than 1048576 bytes" in log  # a page past LIST_PAGE_BYTES
    assert served == 200  # the tool is served all the same, without its listed schema


def test_a_listing_past_its_total_budget_stops_and_keeps_only_what_the_manifests_name(
        tmp_path: Path) -> None:
    with pages_server(tmp_path, "--pages", "30", "--page-bytes", str(900 * 1024)) as url:
        gw, peak, refused, served = start_listing(tmp_path, url)
    print(f"gateway peak RSS with a 30 x 900 KiB tools/list: {peak / 1024:.0f} MiB")
    assert peak < 0.75 * SIDECAR_LIMIT_KIB, f"{peak / 1024:.0f} MiB"
    log = gw.log.read_text()  # type: ignore[attr-defined]
    read = re.search(r"lists more than the gateway reads \(\d+ tools, \d+ bytes after (\d+) pages", log)
    assert read is not None and 16 <= int(read.group(1)) <= 20, log  # 16 MiB of 30 pages
    # echo, on the first page, was kept: its schema is checked (an undeclared argument refused)
    assert refused == 400 and served == 200


def test_a_listed_schema_that_fans_out_is_not_evaluated_and_healthz_keeps_answering(
        tmp_path: Path) -> None:
    with pages_server(tmp_path, "--fan-out") as url:
        gw = start_gateway(manifests(tmp_path, url), tmp_path / "ledger", tmp_path, scopes="p:w")
        try:
            started = time.monotonic()
            r = gw.call("pages.echo", {"text": "hi"})
            took = time.monotonic() - started
            assert httpx2.get(f"{gw.url}/healthz", timeout=5).status_code == 200
        finally:
            stop(gw.proc)
    assert r.status_code == 200, r.text
    assert took < 10, took  # it once took minutes, the gateway frozen all along
    assert "is not checked at the door" in gw.log.read_text()
    assert "expand to more than" in gw.log.read_text()
