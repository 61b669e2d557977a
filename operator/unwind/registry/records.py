"""The version record and index formats, and the one check every loader runs on a version.

The folder loader, the remote loader and ``verify`` all call :func:`check_version`, so a
version refused by one is refused by all of them for the same reason.

What is protected by what: the checksum covers the normalized manifest (what is enforced);
the signature covers tool, version and checksum; the index repeats each version's
lifecycle, checksum and signature, so an edit to the file alone, or to the index alone, is
seen. The index itself is signed as a whole (see :mod:`unwind.registry.index`). The
bookkeeping fields (created, by, approved_by, note) are not covered by the
signature: they are a record of who did what, kept honest by the history being append-only
and reviewed in git, not by cryptography.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..manifest.canonical import canonical_json, checksum_bytes
from ..manifest.model import ToolManifest
from ..manifest.validate import validate_manifest
from .errors import Problem
from .signing import Signature, TrustStore, signing_message

_LIFECYCLES = ("draft", "approved", "deprecated")


class FormatError(ValueError):
    """A record or index that does not have the expected shape."""


def signature_from_json(value: Any) -> Signature | None:
    if value is None:
        return None
    if (not isinstance(value, dict) or set(value) != {"key_id", "value"}
            or not all(isinstance(v, str) for v in value.values())):
        raise FormatError("signature must be null or {key_id, value}")
    return Signature(value["key_id"], value["value"])


def _sig_json(sig: Signature | None) -> dict[str, str] | None:
    return sig.to_json() if sig is not None else None


@dataclass(frozen=True)
class IndexEntry:
    version: int
    lifecycle: str
    checksum: str
    signature: Signature | None

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "lifecycle": self.lifecycle, "checksum": self.checksum,
                "signature": _sig_json(self.signature)}


@dataclass(frozen=True)
class VersionRecord:
    """One immutable version as stored in ``tools/<tool>/v<N>.json``."""

    tool: str
    version: int
    lifecycle: str
    checksum: str
    created: str
    by: str
    action: str  # publish | approve | deprecate | rollback
    manifest: dict[str, Any]
    approved_by: str | None = None
    note: str | None = None
    source_version: int | None = None
    signature: Signature | None = None

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "version": self.version, "lifecycle": self.lifecycle,
                "checksum": self.checksum, "created": self.created, "by": self.by,
                "action": self.action, "approved_by": self.approved_by, "note": self.note,
                "source_version": self.source_version, "signature": _sig_json(self.signature),
                "manifest": self.manifest}

    @classmethod
    def from_json(cls, data: Any) -> VersionRecord:
        if not isinstance(data, dict):
            raise FormatError("a version record must be a JSON object")
        try:
            record = cls(tool=data["tool"], version=data["version"], lifecycle=data["lifecycle"],
                         checksum=data["checksum"], created=data["created"], by=data["by"],
                         action=data["action"], manifest=data["manifest"],
                         approved_by=data.get("approved_by"), note=data.get("note"),
                         source_version=data.get("source_version"),
                         signature=signature_from_json(data.get("signature")))
        except KeyError as exc:
            raise FormatError(f"the field {exc.args[0]!r} is missing") from exc
        if (not isinstance(record.tool, str) or type(record.version) is not int
                or record.lifecycle not in _LIFECYCLES or not isinstance(record.manifest, dict)
                or not isinstance(record.checksum, str)):
            raise FormatError("tool, version, lifecycle, checksum or manifest has the wrong type")
        return record

    def index_entry(self) -> IndexEntry:
        return IndexEntry(self.version, self.lifecycle, self.checksum, self.signature)

    @property
    def message(self) -> bytes:
        return signing_message(self.tool, self.version, self.checksum)


def check_version(tool: str, entry: IndexEntry, data: Any, where: str,
                  trust: TrustStore | None) -> tuple[ToolManifest | None, list[Problem]]:
    """Check one stored version against its index entry (and the trust store, if any)."""

    def problem(code: str, message: str) -> Problem:
        return Problem(tool, entry.version, where, code, message)

    try:
        record = VersionRecord.from_json(data)
    except FormatError as exc:
        return None, [problem("tampered", f"the version file is malformed: {exc}")]
    problems: list[Problem] = []
    m = record.manifest
    if (record.tool, record.version) != (tool, entry.version):
        problems.append(problem("tampered", f"the file says {record.tool} v{record.version}: "
                                "it was copied or renamed from another version"))
    if checksum_bytes(canonical_json(m)) != record.checksum:
        problems.append(problem("tampered", "the manifest was edited after it was written: it "
                                "no longer matches its checksum"))
    if record.checksum != entry.checksum:
        problems.append(problem("tampered", "its checksum differs from the one in index.json"))
    if (m.get("tool"), m.get("version"), m.get("lifecycle")) != (tool, entry.version, record.lifecycle):
        problems.append(problem("tampered", "the manifest's tool, version or lifecycle does not "
                                "match the version it is stored as"))
    if record.lifecycle != entry.lifecycle or record.signature != entry.signature:
        problems.append(problem("tampered", "its lifecycle or signature differs from index.json"))
    if trust is not None:
        code = trust.check(record.message, record.signature)
        if code == "unsigned":
            problems.append(problem(code, "it is not signed, and a trusted key is set: sign it "
                                    "(publish or approve with --key)"))
        elif code == "untrusted" and record.signature is not None:
            problems.append(problem(code, f"it is signed by key {record.signature.key_id}, "
                                    "which is not a trusted key"))
        elif code == "bad_signature":
            problems.append(problem(code, "its signature does not verify for this tool, version "
                                    "and checksum (a signature copied from elsewhere, or a "
                                    "changed checksum)"))
    if problems:
        return None, problems
    manifest, issues = validate_manifest(m)
    if manifest is None or issues:
        return None, [problem("invalid", "the stored manifest is not valid: "
                              + "; ".join(str(i) for i in issues))]
    return manifest, []
