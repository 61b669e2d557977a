"""The manifest's JSON Schema for editors (``unwind schema``; a copy is committed in
schemas/manifest.schema.json and a test keeps it current)."""

from __future__ import annotations

from typing import Any

from .model import ToolManifest


def manifest_json_schema() -> dict[str, Any]:
    schema = ToolManifest.model_json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://unwind.dev/schemas/manifest.schema.json", **schema}
