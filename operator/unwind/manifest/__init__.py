"""The tool manifest: model, references, validation, lint, canonical form, contract tests.

Pure domain code: imports neither kopf nor the Kubernetes client.
"""

from .canonical import canonical_json, checksum
from .issues import Issue
from .model import Effect, Lifecycle, ToolManifest
from .validate import validate_manifest, validate_set

__all__ = ["Effect", "Issue", "Lifecycle", "ToolManifest", "canonical_json", "checksum",
           "validate_manifest", "validate_set"]
