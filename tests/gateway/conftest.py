"""Local mode as a user runs it: the test upstream and `unwind gateway` as real processes.

The example manifests are copied with their upstream base pointed at this test's upstream
(and their timeouts shortened), plus tests/gateway/extra.yaml for the cases the examples
do not show (a draft, a deprecated tool, requires, approval timeouts, redaction, secrets).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest

from unwind.controlplane.kubenode import EXAMPLES_UPSTREAM

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
SCOPES = ("repo:read,repo:write,repo:release,payments:read,payments:write,payments:refund,"
          "test:write")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}{os.pathsep}{ROOT}"}


def wait_for(url: str, proc: subprocess.Popen[bytes], log: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            httpx2.get(url, timeout=1)
            return
        except httpx2.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer in {seconds}s: {log.read_text()[-2000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@dataclass
class UpstreamProc:
    url: str
    proc: subprocess.Popen[bytes]

    def admin(self, path: str, body: Any = None) -> Any:
        if body is None:
            return httpx2.get(f"{self.url}/_admin/{path}", timeout=5).json()
        return httpx2.post(f"{self.url}/_admin/{path}", json=body, timeout=5).json()

    def count(self, route: str | None = None) -> int:
        listing = self.admin("requests")
        return int(listing["count"] if route is None else listing["by_route"].get(route, 0))

    def behave(self, route: str, mode: str, **kw: Any) -> None:
        self.admin("behave", {"route": route, "mode": mode, **kw})


@contextlib.contextmanager
def running_upstream(folder: Path) -> Iterator[UpstreamProc]:
    """The test upstream as a process on a free port, its output in ``folder/upstream.log``."""
    port = free_port()
    log = folder / "upstream.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "tests.upstream.server", "--port", str(port)],
                                cwd=ROOT, env=env(), stdout=out, stderr=subprocess.STDOUT)
    up = UpstreamProc(f"http://127.0.0.1:{port}", proc)
    try:
        wait_for(f"{up.url}/_admin/requests", proc, log)
        yield up
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamProc]:
    with running_upstream(tmp_path_factory.mktemp("upstream")) as up:
        yield up


@pytest.fixture(autouse=True)
def fresh_upstream(request: pytest.FixtureRequest) -> None:
    if "upstream" in request.fixturenames:
        request.getfixturevalue("upstream").admin("reset", {})


@pytest.fixture(scope="session")
def manifests(upstream: UpstreamProc, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("manifests")
    for src in [*sorted((ROOT / "manifests").glob("*.yaml")), HERE / "extra.yaml"]:
        text = src.read_text().replace("http://127.0.0.1:8788", upstream.url).replace(EXAMPLES_UPSTREAM, upstream.url)
        text = text.replace("timeout_ms: 10s", "timeout_ms: 2s").replace("timeout_ms: 30s", "timeout_ms: 2s")
        (out / src.name).write_text(text)
    return out


@dataclass
class GatewayProc:
    url: str
    proc: subprocess.Popen[bytes]
    ledger: Path
    log: Path

    def call(self, tool: str, arguments: dict[str, Any] | None = None, *, run: str | None = "run-1",
             key: str | None = None, raw: bytes | None = None, **body: Any) -> httpx2.Response:
        headers = {"Content-Type": "application/json"}
        if run is not None:
            headers["X-Unwind-Run"] = run
        if key is not None:
            headers["Idempotency-Key"] = key
        content = raw if raw is not None else None
        payload = None if raw is not None else {"arguments": arguments or {}, **body}
        return httpx2.post(f"{self.url}/call/{tool}", json=payload, content=content,
                           headers=headers, timeout=30)

    def entries(self, run: str = "run-1") -> list[dict[str, Any]]:
        """The run's entries as a reader of the folder sees them (pages and journal)."""
        from unwind.ledger.filestore import read_run
        return [e for page in read_run(self.ledger, run) for e in page["status"]["entries"]]


def start_gateway(manifests: Path | list[Path], ledger: Path, log_dir: Path, *extra: str,
                  scopes: str = SCOPES, env_extra: dict[str, str] | None = None) -> GatewayProc:
    port = free_port()
    log = log_dir / f"gateway-{port}.log"
    paths = [str(p) for p in (manifests if isinstance(manifests, list) else [manifests])]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "unwind.cli.main", "gateway", "--manifests", *paths,
             "--ledger-dir", str(ledger), "--listen", f"127.0.0.1:{port}", "--scopes", scopes,
             "--actor", "agent", *extra],
            cwd=ROOT, env={**env(), **(env_extra or {})}, stdout=out, stderr=subprocess.STDOUT)
    gw = GatewayProc(f"http://127.0.0.1:{port}", proc, ledger, log)
    wait_for(f"{gw.url}/healthz", proc, log)
    return gw


@pytest.fixture(scope="module")
def gateway(manifests: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("gateway")
    secrets = base / "secrets" / "upstream-token"
    secrets.mkdir(parents=True)
    (secrets / "token").write_text("Bearer from-a-file\n")
    gw = start_gateway(manifests, base / "ledger", base, "--secrets-dir", str(base / "secrets"))
    try:
        yield gw
    finally:
        stop(gw.proc)


@pytest.fixture
def run_name(request: pytest.FixtureRequest) -> str:
    """A run of its own for each test, so tests sharing a gateway never see each other."""
    import hashlib
    return "t-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]


def copy_tree(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, dirs_exist_ok=True)
