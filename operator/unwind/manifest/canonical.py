"""Canonical JSON and checksums.

The canonical form is the normalized manifest as JSON with sorted keys, no insignificant
whitespace and UTF-8 text. Python's float repr and json's escaping are fixed across
versions, so the checksum of a manifest is stable across runs and interpreters; that is
what a signature covers.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .model import ToolManifest


def canonical_json(value: Any) -> bytes:
    """Serialize any JSON value canonically."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def checksum_bytes(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def checksum(value: ToolManifest | dict[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical form of a manifest (model or normalized dict)."""
    data = value.canonical_dict() if isinstance(value, ToolManifest) else value
    return checksum_bytes(canonical_json(data))
