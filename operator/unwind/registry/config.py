"""The registry part of ``unwind.yaml``, and where the trusted keys come from.

``unwind.yaml`` in the working folder may hold::

    manifests: registry            # the registry folder, or an https:// URL
    manifest_public_key: keys/mf.pub   # a path, a PEM, or a list of either
    signing_key: keys/mf.key       # the default --key of writing commands (a path)

Trusted keys are taken from the first of these that is set: ``--trust`` paths, the
``UNWIND_MANIFEST_PUBLIC_KEY`` environment variable, ``manifest_public_key``. They are not
merged: the narrowest, most explicit source wins, so a stray environment variable cannot
widen what a command line said to trust. The signing key of writing commands is
``--key``, else ``UNWIND_SIGNING_KEY`` (a path), else ``signing_key``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import RegistryError
from .signing import TrustStore

CONFIG_FILE = "unwind.yaml"
DEFAULT_REGISTRY = "registry"
# The keys this module reads (`unwind validate` reports others as likely typos; a part
# of Unwind that reads another key from unwind.yaml adds it here).
KNOWN_KEYS = ("manifests", "manifest_public_key", "signing_key")


@dataclass(frozen=True)
class RegistryConfig:
    registry: str = DEFAULT_REGISTRY
    public_keys: list[str] = field(default_factory=list)
    base: Path = Path()
    signing_key: str | None = None  # a path, relative to base


def load_config(folder: str | os.PathLike[str] | None = None) -> RegistryConfig:
    base = Path(folder) if folder is not None else Path.cwd()
    path = base / CONFIG_FILE
    if not path.is_file():
        return RegistryConfig(base=base)
    try:
        data: Any = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise RegistryError("invalid", f"cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise RegistryError("invalid", f"{path} must be a mapping")
    registry = data.get("manifests", DEFAULT_REGISTRY)
    keys = data.get("manifest_public_key") or []
    keys = [keys] if isinstance(keys, str) else keys
    signing_key = data.get("signing_key")
    if not isinstance(registry, str) or not all(isinstance(k, str) for k in keys) \
            or not isinstance(signing_key, str | None):
        raise RegistryError("invalid", f"{path}: manifests must be a string, "
                            "manifest_public_key a string or a list of strings, and signing_key "
                            "a path")
    if "://" not in registry and not Path(registry).is_absolute():
        registry = str(base / registry) if folder is not None else registry
    if signing_key is not None and folder is not None and not Path(signing_key).is_absolute():
        signing_key = str(base / signing_key)
    return RegistryConfig(registry=registry, public_keys=list(keys), base=base,
                          signing_key=signing_key)


def signing_key_path(given: str | None, config: RegistryConfig,
                     environ: Mapping[str, str] | None = None) -> str | None:
    """The signing key of a writing command: ``--key``, else ``UNWIND_SIGNING_KEY``, else
    ``signing_key`` in unwind.yaml, else none."""
    env = os.environ if environ is None else environ
    return given or env.get("UNWIND_SIGNING_KEY") or config.signing_key


def resolve_trust(trust_paths: Sequence[str] | None, config: RegistryConfig,
                  environ: Mapping[str, str] | None = None) -> TrustStore | None:
    """The trust store to use, or None when no source names a key."""
    if trust_paths:
        return TrustStore.from_files(trust_paths)
    from_env = TrustStore.from_env(environ)
    if from_env is not None:
        return from_env
    if config.public_keys:
        store = TrustStore()
        for value in config.public_keys:
            store.keys.update(TrustStore.from_value(value, f"{CONFIG_FILE} manifest_public_key",
                                                    config.base).keys)
        return store
    return None
