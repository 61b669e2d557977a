"""The signed per-namespace bundle the gateway enforces.

A bundle is one ConfigMap ``unwind-bundle`` holding ``index.json`` and, per tool, the
canonical manifest bytes under a key derived from the tool name (ConfigMap keys cannot hold
``/`` or ``:``). The index names each tool's version, checksum, key and signature, so the
gateway verifies every manifest with the registry's signing code before it enforces any.

When a bundle nears the 1 MiB object limit, the manifests move into content-addressed
shard ConfigMaps (``unwind-bundle-<hash>``) written first, and ``unwind-bundle`` keeps only
the index naming them. The index is still written in one update, so a reader sees all of a
change or none of it; shards no index names any more are deleted afterwards.

Pure code: building and verifying bundles touches no API.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import API_GROUP, API_VERSION
from .manifest.canonical import canonical_json, checksum_bytes
from .manifest.model import ToolManifest
from .registry.signing import Signature, TrustStore, signing_message

BUNDLE_NAME = "unwind-bundle"
INDEX_KEY = "index.json"
SHARD_PREFIX = "unwind-bundle-"
# A ConfigMap is limited to 1 MiB in all; keep the data well below so metadata fits.
SHARD_LIMIT = 900 * 1024
BundleData = dict[str, dict[str, str]]  # ConfigMap name -> data


class BundleError(ValueError):
    """A bundle that must not be enforced; the message names the tool and version."""


@dataclass(frozen=True)
class BundleEntry:
    tool: str
    version: int
    checksum: str
    manifest: bytes  # the canonical JSON the checksum and signature cover
    signature: Signature | None
    source: str  # the ToolManifest object it came from


def entry_key(tool: str) -> str:
    return "m-" + hashlib.sha256(tool.encode()).hexdigest()[:24] + ".json"


def build_bundle(namespace: str, entries: Sequence[BundleEntry]) -> BundleData:
    """The ConfigMaps' data for a bundle of these entries, byte-identical for equal input."""
    ordered = sorted(entries, key=lambda e: e.tool)
    blobs = {entry_key(e.tool): e.manifest.decode("utf-8") for e in ordered}
    shards: dict[str, dict[str, str]] = {}
    placement: dict[str, str] = {}
    if sum(len(b) + len(k) for k, b in blobs.items()) > SHARD_LIMIT - 200 * len(ordered):
        current: dict[str, str] = {}
        size = 0
        groups: list[dict[str, str]] = []
        for key, blob in blobs.items():
            if current and size + len(blob) + len(key) > SHARD_LIMIT:
                groups.append(current)
                current, size = {}, 0
            current[key] = blob
            size += len(blob) + len(key)
        if current:
            groups.append(current)
        for group in groups:
            name = SHARD_PREFIX + hashlib.sha256(canonical_json(group)).hexdigest()[:10]
            shards[name] = group
            placement.update(dict.fromkeys(group, name))
    index = {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": "ToolBundle",
        "namespace": namespace,
        "tools": {
            e.tool: {
                "version": e.version, "checksum": e.checksum, "key": entry_key(e.tool),
                "configMap": placement.get(entry_key(e.tool), BUNDLE_NAME), "source": e.source,
                "signature": e.signature.to_json() if e.signature else None,
            } for e in ordered
        },
    }
    main = {INDEX_KEY: canonical_json(index).decode("utf-8")}
    if not shards:
        main.update(blobs)
    return {BUNDLE_NAME: main, **shards}


def load_bundle(configmaps: Mapping[str, Mapping[str, str]],
                trust: TrustStore | None) -> dict[str, ToolManifest]:
    """Verify a bundle and return its manifests by tool. Any problem refuses the whole
    bundle: checksum, signature (when trust is given), or an unparsable manifest."""
    main = configmaps.get(BUNDLE_NAME)
    if main is None or INDEX_KEY not in main:
        raise BundleError(f"no {BUNDLE_NAME} ConfigMap with {INDEX_KEY}")
    try:
        index: Any = json.loads(main[INDEX_KEY])
        tools = index["tools"]
    except (ValueError, KeyError, TypeError) as exc:
        raise BundleError(f"{BUNDLE_NAME}/{INDEX_KEY} is not a bundle index: {exc}") from exc
    out: dict[str, ToolManifest] = {}
    for tool, info in tools.items():
        where = f"{tool}@v{info.get('version')}"
        blob = configmaps.get(info.get("configMap", ""), {}).get(info.get("key", ""))
        if blob is None:
            raise BundleError(f"{where}: manifest {info.get('configMap')}/{info.get('key')} is missing")
        data = blob.encode("utf-8")
        if checksum_bytes(data) != info.get("checksum"):
            raise BundleError(f"{where}: checksum mismatch: the manifest was edited outside the operator")
        if trust is not None:
            sig = info.get("signature")
            signature = Signature(sig["key_id"], sig["value"]) if isinstance(sig, dict) else None
            problem = trust.check(signing_message(tool, info["version"], info["checksum"]), signature)
            if problem:
                raise BundleError(f"{where}: signature {problem}")
        manifest = ToolManifest.model_validate(json.loads(data))
        if manifest.tool != tool:
            raise BundleError(f"{where}: the manifest is for {manifest.tool!r}")
        # The signed bytes keep the author's `version`; the version that counts is the
        # registry's, from the index (the one the signature names).
        out[tool] = manifest.model_copy(update={"version": info["version"]})
    return out
