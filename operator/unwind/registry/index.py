"""The registry index: every tool's version list, its generation, expiry and signature.

Version signatures bind one version to its tool, number and checksum, but not to the
others: an index cut back to an older, still validly signed version of a tool passed
every check. The index signature binds the whole listing, so cutting, adding, reordering
or replacing any entry breaks it, and two more fields bound what an old signed copy
is worth:

- ``generation`` goes up by one on every write of the index. A reader that remembers the
  generation it last accepted (a gateway between reloads, the CLI's state file) refuses a
  lower one: an older signed copy served again (a rollback) is seen.
- ``expires`` (the signing time plus a TTL, 30 days by default) bounds how long any signed
  copy is accepted at all, even by a reader that remembers nothing; so a registry must be
  re-signed (any keyed write, or ``sign-index``) before it expires.

The signed message is ``unwind-index:`` followed by the canonical JSON of the index
document without its ``signature`` field. The prefix keeps an index signature from ever
verifying as a version signature (``unwind-manifest:``...) made with the same key, and
signing the document as stored, not a parsed form, leaves no field outside the signature.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from ..manifest.canonical import canonical_json
from .errors import Problem
from .records import FormatError, IndexEntry, signature_from_json
from .signing import Signature, TrustStore

INDEX_FORMAT = "unwind-registry/v1"
INDEX_PREFIX = "unwind-index:"
DEFAULT_INDEX_TTL = timedelta(days=30)
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def format_time(when: datetime) -> str:
    return when.astimezone(UTC).strftime(TIME_FORMAT)


def _parse_time(value: Any) -> datetime:
    if not isinstance(value, str):
        raise FormatError("index.json: expires must be a time such as 2025-01-31T00:00:00Z")
    try:
        return datetime.strptime(value, TIME_FORMAT).replace(tzinfo=UTC)
    except ValueError as exc:
        raise FormatError(f"index.json: expires {value!r} is not a time such as "
                          "2025-01-31T00:00:00Z") from exc


def index_message(document: dict[str, Any]) -> bytes:
    """What the index signature covers: the stored document minus its signature."""
    body = {k: v for k, v in document.items() if k != "signature"}
    return INDEX_PREFIX.encode() + canonical_json(body)


@dataclass(frozen=True)
class RegistryIndex:
    """A parsed ``index.json``; ``document`` is the JSON as read, which the signature covers."""

    tools: dict[str, list[IndexEntry]]
    generation: int = 0
    expires: datetime | None = None
    signature: Signature | None = None
    document: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def message(self) -> bytes:
        return index_message(self.document)

    def listed(self) -> set[tuple[str, int]]:
        return {(tool, e.version) for tool, entries in self.tools.items() for e in entries}


def _entries(tool: str, entries: Any) -> list[IndexEntry]:
    if not isinstance(entries, list):
        raise FormatError(f"index.json: {tool} must list its versions")
    parsed = []
    for e in entries:
        if not isinstance(e, dict) or type(e.get("version")) is not int:
            raise FormatError(f"index.json: {tool} has an entry without an integer version")
        parsed.append(IndexEntry(e["version"], str(e.get("lifecycle")), str(e.get("checksum")),
                                 signature_from_json(e.get("signature"))))
    return sorted(parsed, key=lambda entry: entry.version)


def parse_index(data: Any) -> RegistryIndex:
    """The index (empty when ``data`` is None); FormatError when the shape is wrong."""
    if data is None:
        return RegistryIndex({})
    if not isinstance(data, dict) or data.get("format") != INDEX_FORMAT:
        raise FormatError(f"index.json must be an object with format {INDEX_FORMAT!r}")
    tools = data.get("tools")
    if not isinstance(tools, dict):
        raise FormatError("index.json needs tools: {tool: [versions]}")
    generation = data.get("generation", 0)  # an index written before generations: 0
    if type(generation) is not int or generation < 0:
        raise FormatError("index.json: generation must be a whole number")
    signature = signature_from_json(data.get("signature"))
    expires = _parse_time(data["expires"]) if "expires" in data else None
    if signature is not None and (expires is None or generation < 1):
        raise FormatError("index.json: a signed index must carry generation (1 or more) "
                          "and expires")
    return RegistryIndex({tool: _entries(tool, entries) for tool, entries in tools.items()},
                         generation, expires, signature, data)


def new_index_document(previous: RegistryIndex, tools: dict[str, Any]) -> dict[str, Any]:
    """The next index document, unsigned: ``tools`` as JSON, the generation one higher."""
    return {"format": INDEX_FORMAT, "generation": previous.generation + 1,
            "tools": dict(sorted(tools.items()))}


@dataclass(frozen=True)
class Floor:
    """The lowest generation a reader accepts, and where that number came from."""

    generation: int = 0
    source: str = ""


def check_index(index: RegistryIndex, where: str, trust: TrustStore | None, now: datetime,
                floor: Floor = Floor()) -> list[Problem]:
    """What is wrong with the index itself. Without a trust store only the floor is
    checked (nothing else about an unsigned listing can be trusted or refused)."""

    def problem(code: str, message: str) -> Problem:
        return Problem(None, None, where, code, message)

    problems = []
    if index.generation < floor.generation:
        problems.append(problem("index_rollback", (
            f"the index has generation {index.generation}, lower than generation "
            f"{floor.generation} accepted before ({floor.source}): this is an older copy of "
            "the registry (a rollback, or a stale mirror); serve the current index")))
    if trust is None:
        return problems
    folder = os.path.dirname(where) if "://" not in where else "DIR"
    sign_index = f"`unwind manifests sign-index --registry {folder} --key KEY`"
    code = trust.check(index.message, index.signature)
    if code == "unsigned":
        problems.append(problem("unsigned_index", (
            "the index is not signed, and a trusted key is set (an index written before "
            "signed indexes, or by writes without --key): review it, then sign it with "
            f"{sign_index}")))
    elif code == "untrusted" and index.signature is not None:
        problems.append(problem("untrusted_index", (
            f"the index is signed by key {index.signature.key_id}, which is not a trusted "
            f"key: trust that key, or re-sign the index with a trusted one ({sign_index}, "
            "adding --trust with the current signer's public key)")))
    elif code == "bad_signature":
        problems.append(problem("bad_index_signature", (
            "the index's signature does not verify: it was changed after it was signed (a "
            "version list cut back or edited, an entry added or removed); find out what "
            "changed (git log -p index.json) and restore the signed index")))
    elif index.expires is not None and now >= index.expires:
        problems.append(problem("index_expired", (
            f"the index expired at {format_time(index.expires)}: a signed index is accepted "
            "only until it expires, so an old copy cannot be served for ever; re-sign it "
            f"(any write with --key, or {sign_index}), and do so on a schedule, more often "
            "than its TTL (--index-ttl, 30 days by default)")))
    return problems
