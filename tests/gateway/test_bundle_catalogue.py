"""The pod's catalogue over a stand-in for the API server's ConfigMaps: sharded bundles,
refusals, rollback. (The cluster tests run it against the real API server and operator.)"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.bundle import BUNDLE_NAME, BundleEntry, build_bundle
from unwind.gateway.bundle_catalogue import BundleCatalogue
from unwind.gateway.metrics import Metrics
from unwind.manifest.canonical import canonical_json, checksum_bytes
from unwind.manifest.validate import validate_manifest
from unwind.registry.signing import sign

KEY = Ed25519PrivateKey.generate()
PEM = KEY.public_key().public_bytes(serialization.Encoding.PEM,
                                    serialization.PublicFormat.SubjectPublicKeyInfo).decode()


class ConfigMaps:
    """Answers the catalogue's GETs from a dict of (namespace, name) -> data, with a
    resourceVersion that changes on every put."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0

    def put(self, namespace: str, name: str, data: dict[str, str]) -> None:
        self.version += 1
        self.objects[(namespace, name)] = {"metadata": {"name": name, "resourceVersion": str(self.version)},
                                           "data": dict(data)}

    async def get(self, path: str, *, metadata_only: bool = False) -> Any:
        parts = path.split("/")  # /api/v1/namespaces/NS/configmaps/NAME
        obj = self.objects.get((parts[4], parts[6]))
        if obj is None:
            return None
        return {"metadata": obj["metadata"]} if metadata_only else obj


def entries(n: int, description: int = 0) -> list[BundleEntry]:
    out = []
    for i in range(n):
        spec = {"tool": f"shop.tool_{i}", "effect": "read_only", "permission": "shop:read",
                **({"description": "x" * description} if description else {})}
        model, issues = validate_manifest(spec)
        assert model is not None and not issues
        blob = canonical_json(model.canonical_dict())
        out.append(BundleEntry(model.tool, 1, checksum_bytes(blob), blob, f"tool-{i}"))
    return out


def publish(cms: ConfigMaps, generation: int, tools: list[BundleEntry]) -> dict[str, dict[str, str]]:
    data = build_bundle("shop", tools, generation=generation, high_water={e.tool: 1 for e in tools},
                        signer=lambda m: sign(KEY, m))
    for name, cm in data.items():
        cms.put("shop", name, cm)
    return data


def catalogue(cms: ConfigMaps) -> tuple[BundleCatalogue, Metrics]:
    metrics = Metrics()
    return BundleCatalogue(cms, "shop", "unwind-system", metrics), metrics  # type: ignore[arg-type]


def refusals(metrics: Metrics, code: str) -> float:
    return metrics.registry.get_sample_value("unwind_gateway_catalogue_refusals_total", {"code": code}) or 0


async def test_a_sharded_bundle_is_read_shard_by_shard_and_served_whole() -> None:
    cms = ConfigMaps()
    cms.put("unwind-system", "unwind-trust", {"k.pem": PEM})
    data = publish(cms, 10, entries(300, description=4000))
    assert len(data) > 2  # the root and at least two shards
    cat, _ = catalogue(cms)
    assert await cat.poll() is True
    assert cat.ready and cat.generation == "10" and len(cat.tools()) == 300
    assert await cat.poll() is False  # nothing changed: nothing read again


async def test_an_edited_shard_is_refused_and_the_previous_bundle_keeps_serving() -> None:
    cms = ConfigMaps()
    cms.put("unwind-system", "unwind-trust", {"k.pem": PEM})
    publish(cms, 10, entries(3))
    cat, metrics = catalogue(cms)
    await cat.poll()
    data = publish(cms, 11, entries(300, description=4000))
    shard = next(n for n in data if n != BUNDLE_NAME)
    cms.put("shop", shard, {**data[shard], "tools.json": data[shard]["tools.json"].replace("1", "2", 1)})
    assert await cat.poll() is False
    assert refusals(metrics, "shard_mismatch") == 1
    assert cat.ready and cat.generation == "10" and len(cat.tools()) == 3
    assert cat.problem is not None and "still serving generation 10" in cat.problem


async def test_an_older_bundle_put_back_is_refused_as_a_rollback() -> None:
    cms = ConfigMaps()
    cms.put("unwind-system", "unwind-trust", {"k.pem": PEM})
    old = publish(cms, 10, entries(2))
    cat, metrics = catalogue(cms)
    await cat.poll()
    publish(cms, 11, entries(3))
    assert await cat.poll() is True and cat.generation == "11"
    cms.put("shop", BUNDLE_NAME, old[BUNDLE_NAME])
    assert await cat.poll() is False
    assert refusals(metrics, "rollback") == 1 and cat.generation == "11"


async def test_without_trust_nothing_is_served_and_readiness_says_why() -> None:
    cms = ConfigMaps()
    publish(cms, 10, entries(2))
    cat, metrics = catalogue(cms)
    await cat.poll()
    assert not cat.ready and refusals(metrics, "no_trust") == 1
    assert cat.problem is not None and "unwind-trust" in cat.problem
    cms.put("unwind-system", "unwind-trust", {"k.pem": PEM})  # the trust arrives: served
    assert await cat.poll() is True and cat.ready


async def test_a_signed_bundle_with_two_tools_of_one_mcp_name_is_refused_and_the_previous_serves(
        ) -> None:
    cms = ConfigMaps()
    cms.put("unwind-system", "unwind-trust", {"k.pem": PEM})
    publish(cms, 10, entries(2))
    cat, metrics = catalogue(cms)
    await cat.poll()
    clash = []
    for i, name in enumerate(("shop.get_order", "shop__get_order")):
        model, _ = validate_manifest({"tool": name, "effect": "read_only", "permission": "p"})
        assert model is not None
        blob = canonical_json(model.canonical_dict())
        clash.append(BundleEntry(model.tool, 1, checksum_bytes(blob), blob, f"clash-{i}"))
    publish(cms, 11, clash)
    assert await cat.poll() is False
    assert refusals(metrics, "name_collision") == 1
    assert cat.generation == "10" and len(cat.tools()) == 2
    assert cat.problem is not None and "would both be served over MCP" in cat.problem
