"""Runs the contract table (contract_table.py) against every storage, and its read-side
rows through the remote loader over HTTPS."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.registry import HttpStorage, Registry

from .conftest import FolderHarness
from .contract_table import ROWS, Refused, Row, run_row
from .tls import Server, Tls


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_contract_row(row: Row, storage_harness: FolderHarness,
                      signing_keys: dict[str, Ed25519PrivateKey]) -> None:
    run_row(row, storage_harness.make(), storage_harness, signing_keys)


READ_SIDE = [r for r in ROWS if r.read_side]


@pytest.mark.parametrize("row", READ_SIDE, ids=[r.name for r in READ_SIDE])
def test_contract_row_read_through_https(row: Row, https_server: Server, tls: Tls,
                                         signing_keys: dict[str, Ed25519PrivateKey]) -> None:
    harness = FolderHarness(https_server.root)
    storage = harness.make()
    url = f"{https_server.base_url}/{storage.root.name}"
    run_row(row, storage, harness, signing_keys,
            reader=lambda g: Registry(HttpStorage(url, ca_file=tls.ca_file), generations=g))


def test_the_table_covers_every_behaviour_the_contract_names() -> None:
    ops = {step.op for row in ROWS for step in row.steps}
    assert ops >= {"publish", "approve", "deprecate", "rollback", "load", "verify", "history",
                   "edit_version", "swap_signature", "sign_index", "generation", "save_index",
                   "restore_index", "cut_index"}
    refusals = {step.expect.code for row in ROWS for step in row.steps
                if isinstance(step.expect, Refused)}
    assert refusals >= {"unsigned_index", "untrusted_index", "bad_index_signature",
                        "index_expired", "index_rollback", "unlisted_version", "key_required"}
    assert len({r.name for r in ROWS}) == len(ROWS)
