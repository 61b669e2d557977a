"""The answer every edit gives, and the revision token that guards it.

The shape follows semantic-edits-adr.txt §6 so a CLI, the admission webhook
and a future cluster storage can all hand the same JSON to a person or a UI: a
refusal is an expected outcome with a code and, for `has_references`, every
reader with its file and line, not an exception.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

ErrorCode = Literal[
    "stale",
    "not_found",
    "conflict",
    "invalid_name",
    "has_references",
    "invalid",
    "parse_error",
    "unrewritable",
]


def revision(files: Mapping[str, str]) -> str:
    """A short sha256 over the sorted paths and texts: an optimistic-concurrency token.

    Each path and text is length-prefixed, so moving bytes from one file to the
    next, or from a name into a text, always changes the token.
    """
    digest = hashlib.sha256()
    for path in sorted(files):
        for part in (path.encode("utf-8"), files[path].encode("utf-8")):
            digest.update(len(part).to_bytes(8, "big"))
            digest.update(part)
    return digest.hexdigest()[:12]


@dataclass(frozen=True)
class Location:
    """Where a reader is: the file, its 1-based line, and `<tool>: <field>` or `tests[i].<field>`."""

    file: str
    line: int
    path: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "path": self.path}


@dataclass(frozen=True)
class EditError:
    """One reason an edit was refused."""

    code: ErrorCode
    message: str
    references: tuple[Location, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "message": self.message,
            "references": [r.to_json() for r in self.references],
        }


@dataclass(frozen=True)
class Skipped:
    """A file read but left alone because it holds no manifest and no contract test.

    `mentions` lists the edited tool names that still appear in its text (a Helm template
    that renders a ToolManifest, say), which a person has to look at by hand.
    """

    file: str
    reason: str
    mentions: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "reason": self.reason, "mentions": list(self.mentions)}


@dataclass
class Changes:
    """What a successful edit did; empty on a refusal or a no-op.

    `rewrote` counts reader scalars rewritten (each text span once, so an alias
    of an anchored name counts once); the tool's own `tool:` and a followed
    `metadata.name` are not readers and are not counted. `removed` lists the
    removed tool names in request order, then one `test case "<name>" in <file>`
    entry per contract test case removed with its tool; a tool name can never
    contain a space, so the two kinds cannot be confused.
    """

    renamed: list[tuple[str, str]] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    rewrote: int = 0
    files: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "renamed": [{"from": a, "to": b} for a, b in self.renamed],
            "removed": list(self.removed),
            "rewrote": self.rewrote,
            "files": list(self.files),
        }


@dataclass
class EditResult:
    """Outcome of `rename` or `remove`.

    `files` holds the new text of changed files only; it is empty whenever
    `success` is false, so a caller that writes `files` can never write half an
    edit. `revision` is the token of the result, or of the untouched input when
    refused (so a `stale` answer tells the caller what to retry against); either
    way it covers the files edited, not the `skipped` ones.
    """

    success: bool
    revision: str
    changes: Changes = field(default_factory=Changes)
    errors: list[EditError] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)
    skipped: list[Skipped] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict: success, revision, changes, errors and skipped files (never
        the texts)."""
        return {
            "success": self.success,
            "revision": self.revision,
            "changes": self.changes.to_json(),
            "errors": [e.to_json() for e in self.errors],
            "skipped": [s.to_json() for s in self.skipped],
        }


def refused(files: Mapping[str, str], *errors: EditError) -> EditResult:
    """A refusal: nothing to write, current revision, the reasons."""
    return EditResult(success=False, revision=revision(files), errors=list(errors))
