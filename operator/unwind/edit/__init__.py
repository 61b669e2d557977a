"""Edit tool manifest files by tool name, in place, keeping every untouched byte.

`rename` and `remove` address a tool by its name and follow every reference to
it listed in `references.REFERENCES`, so a rename cannot leave a dangling
`compensation.tool` and a removal cannot silently orphan a reader. They are
pure functions over `{path: text}`; `apply_to_paths` is the filesystem storage.
Files holding no manifest and no contract test (Helm templates, other Kubernetes
YAML, configuration) are left alone and listed as skipped (`select`).
Edits are splices into the original text at spans found with ruamel.yaml's
node marks, never a re-dump (DESIGN.md §5, semantic-edits-adr.txt §4).
"""

from unwind.edit.ops import NAME, Validator, occurrences, remove, rename
from unwind.edit.paths import apply_to_paths, expand
from unwind.edit.references import REFERENCES, Place, k8s_name
from unwind.edit.result import Changes, EditError, EditResult, Location, Skipped, revision
from unwind.edit.select import select

__all__ = [
    "NAME",
    "REFERENCES",
    "Changes",
    "EditError",
    "EditResult",
    "Location",
    "Place",
    "Skipped",
    "Validator",
    "apply_to_paths",
    "expand",
    "k8s_name",
    "occurrences",
    "remove",
    "rename",
    "revision",
    "select",
]
