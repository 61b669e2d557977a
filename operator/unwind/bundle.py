"""The signed per-namespace bundle the gateway enforces.

A bundle is the ConfigMap ``unwind-bundle`` and, when it would not fit in one, shard
ConfigMaps. ``unwind-bundle`` always holds ``index.json``, the *signed root*:

    {apiVersion, kind: ToolBundle, namespace, generation, highWater: {tool: N}, mode?,
     tools: {tool: {version, checksum, lifecycle, key, source}}   (everything fits), or
     slot + shards: [{name, sha256}]                               (sharded),
     signature: {key_id, value}}

The signature (Ed25519, over ``unwind-bundle:`` + the canonical JSON of the root without
its signature) binds the namespace, a generation that only goes up, every tool's version,
checksum and lifecycle — so a signed entry cannot be replayed into another namespace, an
older signed bundle cannot be put back, and a tool missing from a signed bundle is absent
on purpose — and, when sharded, the sha256 of each shard's data, which holds its tools'
entries (``tools.json``) and manifests. Each manifest is stored as the canonical bytes its
checksum covers, under a key derived from the tool name (``m-<hash>.json``).
``highWater`` keeps the highest version each tool ever had in the namespace, so a version
number is never given to other content, even after its manifest is deleted.

Shards are named ``unwind-bundle-<slot>-<n>`` with slot ``a`` or ``b`` (fixed names, so RBAC
can name them and a pod can mount them): a new sharded bundle is written into the slot the
current one does not use, then the root is switched in one update, then the old slot is
deleted. A reader sees all of a change or none of it: a root whose shards are not there
yet fails its digest check, and the previous bundle stays in force.

Pure code: building and verifying bundles touches no API.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import API_GROUP, API_VERSION
from .manifest.canonical import canonical_json, checksum_bytes
from .manifest.model import ToolManifest
from .manifest.validate import validate_manifest
from .registry.records import FormatError, signature_from_json
from .registry.signing import Signature, TrustStore

log = logging.getLogger("unwind.bundle")
BUNDLE_NAME = "unwind-bundle"
INDEX_KEY = "index.json"
TOOLS_KEY = "tools.json"
SHARD_PREFIX = "unwind-bundle-"
SLOTS = ("a", "b")
MAX_SHARDS = 64  # per slot; the chart's RBAC names exactly these
# A ConfigMap is limited to 1 MiB in all; keep the data well below so metadata fits.
SHARD_LIMIT = 900 * 1024
MESSAGE_PREFIX = b"unwind-bundle:"
BundleData = dict[str, dict[str, str]]  # ConfigMap name -> data
Signer = Callable[[bytes], Signature]


class BundleError(ValueError):
    """A bundle that must not be enforced. ``code`` names the kind of problem."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


MAX_DEPTH = 64  # nesting of any JSON text in a bundle: a manifest needs far less


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} is out of range for a JSON number")
    return value


def _depth_ok(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests at most ``limit`` levels (iteratively: no recursion to blow)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return True


def loads(text: Any, where: str) -> Any:
    """Strict JSON of a bundle's ConfigMap value: text only, no NaN or Infinity (canonical
    JSON cannot hold them, so nothing signed can), at most ``MAX_DEPTH`` levels deep.
    Anything else is a ``BundleError``, never another exception."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        raise BundleError("not_json", f"{where} is not text")
    try:
        value = json.loads(text, parse_constant=_reject_constant, parse_float=_finite)
    except RecursionError:
        raise BundleError("not_json", f"{where} nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise BundleError("not_json", f"{where} is not JSON: {exc}") from exc
    if not _depth_ok(value):
        raise BundleError("not_json", f"{where} nests deeper than {MAX_DEPTH} levels")
    return value


@dataclass(frozen=True)
class BundleEntry:
    tool: str
    version: int
    checksum: str
    manifest: bytes  # the canonical JSON the checksum covers
    source: str  # the ToolManifest object it came from
    lifecycle: str = "approved"  # as enforced: approved or deprecated (the spec may say draft)


@dataclass(frozen=True)
class Bundle:
    """A verified bundle."""

    namespace: str
    generation: int
    key_id: str | None
    manifests: dict[str, ToolManifest]
    sources: dict[str, str] = field(default_factory=dict)  # tool -> ToolManifest object
    high_water: dict[str, int] = field(default_factory=dict)
    checksums: dict[str, str] = field(default_factory=dict)  # tool -> checksum of its bytes
    blobs: dict[str, bytes] = field(default_factory=dict)  # tool -> the verified canonical bytes
    mode: str = "enforce"  # or "observe": violations are recorded, not refused (a rollout)


def shard_name(slot: str, n: int) -> str:
    return f"{SHARD_PREFIX}{slot}-{n}"


def shard_names() -> list[str]:
    """Every name a shard may have (what RBAC and a pod's volume list)."""
    return [shard_name(s, n) for s in SLOTS for n in range(MAX_SHARDS)]


def entry_key(tool: str) -> str:
    return "m-" + hashlib.sha256(tool.encode()).hexdigest()[:24] + ".json"


def _size(value: Any) -> int:
    return len(canonical_json(value))


def data_size(data: Mapping[str, str]) -> int:
    """Bytes a ConfigMap's data counts against its 1 MiB limit (keys and values, unescaped)."""
    return sum(len(k.encode()) + len(v.encode()) for k, v in data.items())


def signing_message(root: Mapping[str, Any]) -> bytes:
    return MESSAGE_PREFIX + canonical_json({k: v for k, v in root.items() if k != "signature"})


def build_bundle(namespace: str, entries: Sequence[BundleEntry], *, generation: int,
                 high_water: Mapping[str, int], signer: Signer | None, slot: str = "a",
                 mode: str = "enforce") -> BundleData:
    """The ConfigMaps' data for a bundle of these entries; byte-identical for equal input
    (Ed25519 signatures are deterministic). Raises BundleError when it cannot fit."""
    ordered = sorted(entries, key=lambda e: e.tool)
    blobs = {entry_key(e.tool): e.manifest.decode("utf-8") for e in ordered}
    infos: dict[str, dict[str, Any]] = {e.tool: {"version": e.version, "checksum": e.checksum, "lifecycle": e.lifecycle,
                      "key": entry_key(e.tool), "source": e.source} for e in ordered}
    root: dict[str, Any] = {"apiVersion": f"{API_GROUP}/{API_VERSION}", "kind": "ToolBundle",
                            "namespace": namespace, "generation": generation,
                            "highWater": dict(sorted(high_water.items()))}
    if mode != "enforce":  # left out when enforcing, so such bundles keep their bytes
        root["mode"] = mode
    signature_room = 200
    whole = _size({**root, "tools": infos}) + len(INDEX_KEY) + data_size(blobs)
    shards: BundleData = {}
    if whole + signature_room <= SHARD_LIMIT:
        root["tools"] = infos
        data = dict(blobs)
    else:
        groups: list[list[str]] = [[]]
        used = len(TOOLS_KEY) + 2
        for tool, info in infos.items():  # real serialized sizes: the entry, its key and blob
            cost = _size({tool: info}) + data_size({info["key"]: blobs[info["key"]]})
            if groups[-1] and used + cost > SHARD_LIMIT:
                groups.append([])
                used = len(TOOLS_KEY) + 2
            groups[-1].append(tool)
            used += cost
        if len(groups) > MAX_SHARDS:
            raise BundleError("too_large", f"the bundle needs {len(groups)} shards; at most {MAX_SHARDS} "
                                           "are allowed: split the namespace's manifests")
        listed = []
        for n, tools in enumerate(groups):
            name = shard_name(slot, n)
            shard = {TOOLS_KEY: canonical_json({t: infos[t] for t in tools}).decode("utf-8"),
                     **{infos[t]["key"]: blobs[infos[t]["key"]] for t in tools}}
            shards[name] = shard
            listed.append({"name": name, "sha256": checksum_bytes(canonical_json(shard))})
        root["slot"] = slot
        root["shards"] = listed
        data = {}
    if signer is not None:
        root["signature"] = signer(signing_message(root)).to_json()
    index = canonical_json(root).decode("utf-8")
    if data_size({INDEX_KEY: index, **data}) > SHARD_LIMIT:
        raise BundleError("too_large", f"the bundle index is {len(index.encode())} bytes, over {SHARD_LIMIT}")
    return {BUNDLE_NAME: {INDEX_KEY: index, **data}, **shards}


def read_root(configmaps: Mapping[str, Mapping[str, str]]) -> dict[str, Any]:
    """The root index as written, unverified (to find shard names, or the generation a
    verified reader compares against)."""
    main = configmaps.get(BUNDLE_NAME)
    if not isinstance(main, Mapping) or INDEX_KEY not in main:
        raise BundleError("missing_index", f"no {BUNDLE_NAME} ConfigMap with {INDEX_KEY}")
    root = loads(main[INDEX_KEY], f"{BUNDLE_NAME}/{INDEX_KEY}")
    if not isinstance(root, dict):
        raise BundleError("not_json", f"{BUNDLE_NAME}/{INDEX_KEY} is not a JSON object")
    return root


def load_bundle(configmaps: Mapping[str, Mapping[str, str]], trust: TrustStore | None, *,
                namespace: str, min_generation: int = 0, insecure: bool = False) -> Bundle:
    """Verify a bundle and return its manifests. Any problem refuses the whole bundle: the
    root signature, namespace and generation, each shard's digest, each manifest's checksum
    and validity. ``trust`` is required; ``insecure=True`` (tests only) skips signatures,
    loudly.

    A malformed bundle (whoever can write the namespace's ConfigMaps can put anything
    there) raises ``BundleError`` like any other that does not verify, never another
    exception: every reader treats it as "no verified bundle"."""
    if trust is None and not insecure:
        raise TypeError("load_bundle needs a trust store; pass insecure=True only in tests")
    try:
        return _load(configmaps, trust, namespace, min_generation)
    except BundleError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, RecursionError, UnicodeError) as exc:
        raise BundleError("malformed", f"the bundle cannot be read ({type(exc).__name__}: "
                                       f"{str(exc)[:200]})") from None


def _load(configmaps: Mapping[str, Mapping[str, str]], trust: TrustStore | None, namespace: str,
          min_generation: int) -> Bundle:
    root = read_root(configmaps)
    if trust is None:
        log.warning("INSECURE: bundle of namespace %s loaded without checking signatures", namespace)
        key_id = None
    else:
        key_id = _check_signature(root, trust)
    if root.get("namespace") != namespace:
        raise BundleError("wrong_namespace", f"the bundle is for namespace {root.get('namespace')!r}, "
                                             f"not {namespace!r}: it was copied from elsewhere")
    generation = root.get("generation")
    if not isinstance(generation, int) or isinstance(generation, bool):
        raise BundleError("bad_index", "the bundle index has no integer generation")
    if generation < min_generation:
        raise BundleError("rollback", f"generation {generation} is older than {min_generation}, already "
                                      "accepted: an old bundle was put back")
    mode = root.get("mode", "enforce")
    if mode not in ("enforce", "observe"):
        raise BundleError("bad_index", f"the bundle's mode {mode!r} is neither enforce nor observe")
    infos, data = _entries(root, configmaps)
    out: dict[str, ToolManifest] = {}
    sources: dict[str, str] = {}
    for tool, info in infos.items():
        out[tool] = _manifest(tool, info, data)
        sources[tool] = str(info.get("source") or "")
    high = root.get("highWater") or {}
    return Bundle(namespace, generation, key_id, out, sources,
                  {str(k): int(v) for k, v in high.items() if isinstance(v, int)} if isinstance(high, dict) else {},
                  {t: str(i["checksum"]) for t, i in infos.items()},
                  {t: data[str(i["key"])].encode("utf-8") for t, i in infos.items()}, mode)


def _check_signature(root: Mapping[str, Any], trust: TrustStore) -> str:
    try:
        signature = signature_from_json(root.get("signature"))
    except FormatError as exc:
        raise BundleError("bad_signature", f"the bundle index signature is malformed: {exc}") from exc
    problem = trust.check(signing_message(root), signature)
    if problem == "unsigned":
        raise BundleError("unsigned", "the bundle index is not signed")
    if problem == "untrusted":
        assert signature is not None
        raise BundleError("untrusted_key", f"the bundle is signed by key {signature.key_id}, which is not "
                                           "in the trust ConfigMap unwind-trust")
    if problem:
        raise BundleError("bad_signature", "the bundle index signature does not verify: it was edited "
                                           "outside the operator")
    assert signature is not None
    return signature.key_id


def _entries(root: Mapping[str, Any], configmaps: Mapping[str, Mapping[str, str]]
             ) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """tool -> index entry, and every blob key -> text, from the root or its shards."""
    if "shards" not in root:
        tools = root.get("tools")
        if not isinstance(tools, dict) or not all(isinstance(i, dict) for i in tools.values()):
            raise BundleError("bad_index", f"{BUNDLE_NAME}/{INDEX_KEY} has no tools mapping of tool -> entry")
        return tools, dict(configmaps.get(BUNDLE_NAME) or {})
    shards = root.get("shards")
    if not isinstance(shards, list):
        raise BundleError("bad_index", "the bundle index's shards is not a list")
    infos: dict[str, dict[str, Any]] = {}
    data: dict[str, str] = {}
    for shard in shards:
        name = shard.get("name") if isinstance(shard, dict) else None
        content = configmaps.get(str(name))
        if content is None:
            raise BundleError("missing_shard", f"shard ConfigMap {name} is missing (not written yet, or deleted)")
        if checksum_bytes(canonical_json(dict(content))) != shard.get("sha256"):
            raise BundleError("shard_mismatch", f"shard ConfigMap {name} does not match the signed index: "
                                                "edited outside the operator, or not updated yet")
        listed = loads(content.get(TOOLS_KEY, ""), f"{name}/{TOOLS_KEY}")
        if not isinstance(listed, dict):
            raise BundleError("bad_index", f"{name}/{TOOLS_KEY} is not a mapping of tool -> entry")
        infos.update(listed)
        data.update(content)
    return infos, data


def _manifest(tool: str, info: Mapping[str, Any], data: Mapping[str, str]) -> ToolManifest:
    version, digest = info.get("version"), info.get("checksum")
    where = f"{tool}@v{version}"
    if not isinstance(version, int) or not isinstance(digest, str):
        raise BundleError("bad_index", f"{where}: the index entry needs an integer version and a checksum")
    blob = data.get(str(info.get("key", "")))
    if blob is None:
        raise BundleError("missing_manifest", f"{where}: manifest {info.get('key')} is missing")
    raw = blob.encode("utf-8")
    if checksum_bytes(raw) != digest:
        raise BundleError("checksum_mismatch", f"{where}: the manifest was edited outside the operator")
    parsed = loads(blob, f"{where}: the manifest")
    manifest, issues = validate_manifest(parsed)
    if manifest is None or issues:
        raise BundleError("invalid_manifest", f"{where}: the manifest is invalid: {issues[0] if issues else ''}")
    if manifest.tool != tool:
        raise BundleError("bad_index", f"{where}: the manifest is for {manifest.tool!r}")
    lifecycle = info.get("lifecycle", "approved")
    if lifecycle not in ("approved", "deprecated"):
        raise BundleError("bad_index", f"{where}: lifecycle {lifecycle!r} is not enforceable")
    # The signed bytes keep the author's `version` and `lifecycle`; what counts is the
    # registry's version and the lifecycle it was approved as, both bound by the signature.
    return manifest.model_copy(update={"version": version, "lifecycle": lifecycle})
