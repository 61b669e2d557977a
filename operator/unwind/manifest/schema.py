"""The manifest's JSON Schema for editors (``unwind schema``; a copy is committed in
schemas/manifest.schema.json and a test keeps it current), and the schema of the ``kind:
ToolManifest`` resource form (``unwind schema --resource``)."""

from __future__ import annotations

from typing import Any

from .. import API_GROUP, API_VERSION
from .model import ToolManifest


def manifest_json_schema() -> dict[str, Any]:
    schema = ToolManifest.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://unwind.dev/schemas/manifest.schema.json", **schema}


def resource_json_schema() -> dict[str, Any]:
    """The ``kind: ToolManifest`` resource as a file holds it (what ``kubectl apply -f``
    reads): apiVersion, kind, metadata and the manifest as ``spec``."""
    spec = ToolManifest.model_json_schema()
    defs = spec.pop("$defs", {})
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://unwind.dev/schemas/toolmanifest.schema.json",
        "title": "ToolManifest",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": f"{API_GROUP}/{API_VERSION}"},
            "kind": {"const": "ToolManifest"},
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "maxLength": 253,
                             "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"},
                    "namespace": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            "spec": spec,
        },
        "additionalProperties": False,
        "$defs": defs,
    }
