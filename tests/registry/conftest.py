"""Fixtures for the registry tests: signing keys, storages, and an HTTPS static server.

``storage_harness`` is parametrized with each storage the registry supports. Today that
is the folder; the cluster storage (ControllerRevisions) is added as another parameter
with its own harness, and every contract-table row then runs against it unchanged.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.registry import FolderStorage, Storage
from unwind.registry.storage import INDEX_FILE, dump_json

from .tls import Server, Tls, make_tls, serve


class FolderHarness:
    """Makes folder storages and edits them behind the registry's back (for tamper rows)."""

    name = "folder"

    def __init__(self, root: Path) -> None:
        self.root = root

    def make(self) -> FolderStorage:
        return FolderStorage(self.root / uuid.uuid4().hex)

    def folder(self, storage: Storage) -> Path | None:
        return Path(storage.root) if isinstance(storage, FolderStorage) else None

    def overwrite_version(self, storage: Storage, tool: str, version: int,
                          record: dict[str, Any]) -> None:
        Path(storage.location(tool, version)).write_bytes(dump_json(record))

    def overwrite_index(self, storage: Storage, index: dict[str, Any]) -> None:
        assert isinstance(storage, FolderStorage)
        (storage.root / INDEX_FILE).write_bytes(dump_json(index))

    def read_raw_index(self, storage: Storage) -> Any:
        assert isinstance(storage, FolderStorage)
        return json.loads((storage.root / INDEX_FILE).read_text())


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The CLI remembers index generations under $XDG_CACHE_HOME: keep each test's own."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


@pytest.fixture(scope="session")
def signing_keys() -> dict[str, Ed25519PrivateKey]:
    """k1 is the trusted key in the contract table, k2 a key nobody trusts."""
    return {"k1": Ed25519PrivateKey.generate(), "k2": Ed25519PrivateKey.generate()}


@pytest.fixture(scope="session")
def served_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="session")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_tls(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="session")
def https_server(served_root: Path, tls: Tls) -> Iterator[Server]:
    with serve(served_root, tls) as server:
        yield server


@pytest.fixture(params=["folder"])
def storage_harness(request: pytest.FixtureRequest, tmp_path: Path) -> FolderHarness:
    if request.param == "folder":
        return FolderHarness(tmp_path)
    raise AssertionError(f"unknown storage {request.param}")
