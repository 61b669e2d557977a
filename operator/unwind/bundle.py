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
from .manifest.validate import validate_manifest
from .registry.records import FormatError, signature_from_json
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
    lifecycle: str = "approved"  # as enforced: approved or deprecated (the spec may say draft)


def entry_key(tool: str) -> str:
    return "m-" + hashlib.sha256(tool.encode()).hexdigest()[:24] + ".json"


def build_bundle(namespace: str, entries: Sequence[BundleEntry]) -> BundleData:
    """The ConfigMaps' data for a bundle of these entries, byte-identical for equal input."""
    ordered = sorted(entries, key=lambda e: e.tool)
    blobs = {entry_key(e.tool): e.manifest.decode("utf-8") for e in ordered}
    shards: dict[str, dict[str, str]] = {}
    placement: dict[str, str] = {}
    sizes = {k: len(e.manifest) + len(k) for k, e in zip(blobs, ordered, strict=True)}  # bytes
    if sum(sizes.values()) > SHARD_LIMIT - 200 * len(ordered):
        current: dict[str, str] = {}
        size = 0
        groups: list[dict[str, str]] = []
        for key, blob in blobs.items():
            if current and size + sizes[key] > SHARD_LIMIT:
                groups.append(current)
                current, size = {}, 0
            current[key] = blob
            size += sizes[key]
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
                "lifecycle": e.lifecycle,
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
    except ValueError as exc:
        raise BundleError(f"{BUNDLE_NAME}/{INDEX_KEY} is not JSON: {exc}") from exc
    tools = index.get("tools") if isinstance(index, dict) else None
    if not isinstance(tools, dict) or not all(isinstance(i, dict) for i in tools.values()):
        raise BundleError(f"{BUNDLE_NAME}/{INDEX_KEY} has no tools mapping of tool -> entry")
    out: dict[str, ToolManifest] = {}
    for tool, info in tools.items():
        version, digest = info.get("version"), info.get("checksum")
        where = f"{tool}@v{version}"
        if not isinstance(version, int) or not isinstance(digest, str):
            raise BundleError(f"{where}: the index entry needs an integer version and a checksum")
        blob = configmaps.get(str(info.get("configMap", "")), {}).get(str(info.get("key", "")))
        if blob is None:
            raise BundleError(f"{where}: manifest {info.get('configMap')}/{info.get('key')} is missing")
        data = blob.encode("utf-8")
        if checksum_bytes(data) != digest:
            raise BundleError(f"{where}: checksum mismatch: the manifest was edited outside the operator")
        if trust is not None:
            try:
                signature = signature_from_json(info.get("signature"))
            except FormatError as exc:
                raise BundleError(f"{where}: {exc}") from exc
            problem = trust.check(signing_message(tool, version, digest), signature)
            if problem:
                raise BundleError(f"{where}: signature {problem}")
        try:
            raw = json.loads(data)
        except ValueError as exc:
            raise BundleError(f"{where}: the manifest is not JSON: {exc}") from exc
        manifest, issues = validate_manifest(raw)
        if manifest is None or issues:
            raise BundleError(f"{where}: the manifest is invalid: {issues[0] if issues else ''}")
        if manifest.tool != tool:
            raise BundleError(f"{where}: the manifest is for {manifest.tool!r}")
        lifecycle = info.get("lifecycle", "approved")
        if lifecycle not in ("approved", "deprecated"):
            raise BundleError(f"{where}: lifecycle {lifecycle!r} is not enforceable")
        # The signed bytes keep the author's `version` and `lifecycle`; what counts is the
        # registry's version (the one the signature names) and the lifecycle it was approved as.
        out[tool] = manifest.model_copy(update={"version": version, "lifecycle": lifecycle})
    return out
