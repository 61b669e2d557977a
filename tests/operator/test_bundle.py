"""The signed bundle: what its signature binds, and the attacks it now refuses."""

from __future__ import annotations

import copy
import json
import logging
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.bundle import (
    BUNDLE_NAME,
    INDEX_KEY,
    MAX_SHARDS,
    SHARD_LIMIT,
    BundleEntry,
    BundleError,
    build_bundle,
    data_size,
    load_bundle,
    shard_names,
)
from unwind.manifest.canonical import canonical_json, checksum_bytes
from unwind.manifest.validate import validate_manifest
from unwind.registry.signing import TrustStore, sign

KEY = Ed25519PrivateKey.generate()
TRUST = TrustStore([KEY.public_key()])


def signer(message: bytes) -> Any:
    return sign(KEY, message)


def entry(tool: str, version: int = 1, description: str = "", source: str = "") -> BundleEntry:
    spec = {"tool": tool, "effect": "read_only", "permission": "shop:read",
            **({"description": description} if description else {})}
    model, issues = validate_manifest(spec)
    assert model is not None and not issues
    blob = canonical_json(model.canonical_dict())
    return BundleEntry(tool, version, checksum_bytes(blob), blob, source or tool.replace("_", "-"))


def bundle(namespace: str = "shop", generation: int = 5, entries: list[BundleEntry] | None = None,
           slot: str = "a") -> dict[str, dict[str, str]]:
    entries = [entry("shop.get_order"), entry("shop.list_orders", 3)] if entries is None else entries
    return build_bundle(namespace, entries, generation=generation,
                        high_water={e.tool: e.version for e in entries}, signer=signer, slot=slot)


def test_a_signed_bundle_loads_with_its_namespace_generation_and_versions() -> None:
    loaded = load_bundle(bundle(), TRUST, namespace="shop")
    assert loaded.generation == 5 and loaded.namespace == "shop"
    assert {t: m.version for t, m in loaded.manifests.items()} == {"shop.get_order": 1, "shop.list_orders": 3}
    assert loaded.high_water == {"shop.get_order": 1, "shop.list_orders": 3}


def test_another_namespaces_signed_bundle_replayed_here_is_refused() -> None:
    theirs = bundle(namespace="payments")
    with pytest.raises(BundleError, match="wrong_namespace: the bundle is for namespace 'payments'"):
        load_bundle(theirs, TRUST, namespace="shop")


def test_an_older_signed_bundle_put_back_is_refused() -> None:
    old, new = bundle(generation=5), bundle(generation=6)
    accepted = load_bundle(new, TRUST, namespace="shop").generation
    with pytest.raises(BundleError, match="rollback: generation 5 is older than 6"):
        load_bundle(old, TRUST, namespace="shop", min_generation=accepted)


def test_deleting_a_tool_from_the_signed_index_breaks_the_signature() -> None:
    data = bundle()
    index = json.loads(data[BUNDLE_NAME][INDEX_KEY])
    del index["tools"]["shop.list_orders"]  # e.g. to drop an approval requirement with the tool
    data[BUNDLE_NAME][INDEX_KEY] = canonical_json(index).decode()
    with pytest.raises(BundleError, match="bad_signature"):
        load_bundle(data, TRUST, namespace="shop")


def test_raising_a_version_or_changing_a_lifecycle_in_the_index_breaks_the_signature() -> None:
    for change in ({"version": 9}, {"lifecycle": "deprecated"}):
        data = bundle()
        index = json.loads(data[BUNDLE_NAME][INDEX_KEY])
        index["tools"]["shop.get_order"].update(change)
        data[BUNDLE_NAME][INDEX_KEY] = canonical_json(index).decode()
        with pytest.raises(BundleError, match="bad_signature"):
            load_bundle(data, TRUST, namespace="shop")


def test_an_unsigned_or_foreign_signed_bundle_is_refused() -> None:
    unsigned = build_bundle("shop", [entry("shop.get_order")], generation=1, high_water={}, signer=None)
    with pytest.raises(BundleError, match="unsigned"):
        load_bundle(unsigned, TRUST, namespace="shop")
    other = TrustStore([Ed25519PrivateKey.generate().public_key()])
    with pytest.raises(BundleError, match="untrusted_key"):
        load_bundle(bundle(), other, namespace="shop")


def test_loading_without_a_trust_store_needs_an_explicit_insecure_flag(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(TypeError, match="needs a trust store"):
        load_bundle(bundle(), None, namespace="shop")
    with caplog.at_level(logging.WARNING):
        assert load_bundle(bundle(), None, namespace="shop", insecure=True).manifests
    assert "INSECURE" in caplog.text


def big(n: int, description: str = "x" * 400) -> list[BundleEntry]:
    return [entry(f"svc{i:05d}.get", description=description) for i in range(n)]


def test_5000_manifests_are_sharded_under_the_object_limit_and_verify() -> None:
    data = bundle(entries=big(5000))
    assert 1 < len(data) <= MAX_SHARDS + 1
    for name, content in data.items():
        assert data_size(content) <= SHARD_LIMIT, name
        assert name == BUNDLE_NAME or name in shard_names()
    assert len(load_bundle(data, TRUST, namespace="shop").manifests) == 5000


def test_editing_or_removing_a_shard_refuses_the_whole_bundle() -> None:
    data = bundle(entries=big(3000))
    shard = next(n for n in data if n != BUNDLE_NAME)
    edited = copy.deepcopy(data)
    key = next(k for k in edited[shard] if k.startswith("m-"))
    edited[shard][key] = edited[shard][key].replace("shop:read", "shop:admin")
    with pytest.raises(BundleError, match="shard_mismatch"):
        load_bundle(edited, TRUST, namespace="shop")
    missing = {n: d for n, d in data.items() if n != shard}
    with pytest.raises(BundleError, match="missing_shard"):
        load_bundle(missing, TRUST, namespace="shop")


def test_a_new_sharded_bundle_goes_to_the_other_slot() -> None:
    a, b = bundle(entries=big(3000), slot="a"), bundle(entries=big(3000), slot="b", generation=6)
    assert all(n.startswith("unwind-bundle-a-") for n in a if n != BUNDLE_NAME)
    assert all(n.startswith("unwind-bundle-b-") for n in b if n != BUNDLE_NAME)
    both = {**a, **b}  # the new shards are written while the old root still names the old ones
    assert load_bundle({**both, BUNDLE_NAME: a[BUNDLE_NAME]}, TRUST, namespace="shop").generation == 5
    assert load_bundle({**both, BUNDLE_NAME: b[BUNDLE_NAME]}, TRUST, namespace="shop").generation == 6


def test_1000_manifests_with_long_descriptions_fit_with_non_ascii_text_counted_in_bytes() -> None:
    data = bundle(entries=big(1000, description="é" * 400))  # two bytes each in UTF-8
    assert all(data_size(content) <= SHARD_LIMIT for content in data.values())
    assert len(load_bundle(data, TRUST, namespace="shop").manifests) == 1000


def test_the_same_input_gives_the_same_bytes() -> None:
    assert bundle() == bundle()


def test_observe_mode_is_signed_into_the_bundle() -> None:
    observing = build_bundle("shop", [entry("shop.get_order")], generation=1, high_water={}, signer=signer,
                             mode="observe")
    assert load_bundle(observing, TRUST, namespace="shop").mode == "observe"
    assert load_bundle(bundle(), TRUST, namespace="shop").mode == "enforce"
    flipped = copy.deepcopy(observing)
    index = json.loads(flipped[BUNDLE_NAME][INDEX_KEY])
    index["mode"] = "enforce"
    flipped[BUNDLE_NAME][INDEX_KEY] = canonical_json(index).decode()
    with pytest.raises(BundleError, match="bad_signature"):
        load_bundle(flipped, TRUST, namespace="shop")
