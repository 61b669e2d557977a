"""Errors and problems the registry reports.

Every refusal carries a short machine-readable code (the CLI prints the message; tests and
the contract table compare the code) and a sentence naming the tool, the version and the
file, because the person who reads it must be able to go and look at that file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Codes, and when each is used.
CODES = {
    "invalid": "a manifest, an argument or the resulting set of manifests is not valid",
    "not_found": "no such tool, version or replacement in the registry",
    "not_draft": "approve was asked for a version that is not a draft",
    "four_eyes": "with --four-eyes, the author of a draft may not approve it",
    "no_approved_version": "deprecate needs an approved (enforceable) version",
    "conflict": "another writer created the same version first; retry",
    "missing": "the index lists a version whose file is absent",
    "tampered": "a stored version no longer matches its checksum or the index",
    "bad_signature": "a signature does not verify for its version and checksum",
    "untrusted": "a version is signed by a key the trust store does not hold",
    "unsigned": "a version has no signature while a trust store is set",
    "bad_key": "a key file or PEM text cannot be read",
    "remote": "a remote registry URL is refused, redirects, is too slow or too large",
    "unsigned_index": "index.json has no signature while a trust store is set",
    "untrusted_index": "index.json is signed by a key that is not trusted (or, for a writer, "
                       "neither its --key nor a trusted key)",
    "bad_index_signature": "index.json's signature does not verify: it changed after signing",
    "index_expired": "index.json's signature has expired: re-sign the index",
    "index_rollback": "index.json's generation is lower than one accepted before",
    "unlisted_version": "a version file is present that index.json does not list",
    "key_required": "a write needs --key: index.json is signed, or a trusted key is set (readers "
                    "would refuse an unsigned version)",
}


class RegistryError(Exception):
    """A refused operation: ``code`` is one of :data:`CODES`."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Problem:
    """One finding of ``verify``: which tool, which version, which file, and what is wrong.
    A finding about the index as a whole has no tool and no version."""

    tool: str | None
    version: int | None
    file: str
    code: str
    message: str

    def __str__(self) -> str:
        if self.tool is None:
            return f"{self.file}: {self.message}"
        return f"{self.tool} v{self.version} ({self.file}): {self.message}"

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "version": self.version, "file": self.file,
                "code": self.code, "message": self.message}

    def error(self) -> RegistryError:
        return RegistryError(self.code, str(self))
