"""The registry: immutable, numbered versions of each tool's manifest over any storage.

Every change is a new version: publishing, approving, deprecating and rolling back all
append, none rewrites, so the history is the audit trail. The version number is part of
the manifest (and so of its checksum and signature): a version cannot be passed off as
another one. Operations that start from a stored version (approve, deprecate, rollback)
check that version's checksum first, so an edited draft cannot be laundered into a freshly
signed approved version.

What a gateway enforces is :meth:`Registry.load`: the newest non-draft version of each
tool. A draft never replaces the enforced version; it only becomes enforceable through an
approval, which is a new version of its own.

Every write of the index raises its generation and, with a key, signs it (see
:mod:`unwind.registry.index`). A signed index stays signed: a writer must hold a key, and
the index it writes over must verify against that key or a trusted one, so a writer never
re-signs (launders) an index someone changed behind the registry's back.
"""

from __future__ import annotations

import builtins
import difflib
import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..manifest.canonical import checksum
from ..manifest.model import ToolManifest
from ..manifest.validate import validate_manifest, validate_set
from .errors import Problem, RegistryError
from .index import (
    DEFAULT_INDEX_TTL,
    Floor,
    RegistryIndex,
    check_index,
    format_time,
    index_message,
    new_index_document,
    parse_index,
)
from .records import FormatError, IndexEntry, VersionRecord, check_version
from .signing import TrustStore, sign
from .sources import Source, read_sources
from .state import Generations
from .storage import Storage

Entries = list[IndexEntry]
Index = dict[str, Entries]
# `Registry.list` shadows the builtin inside the class body, hence `builtins.list` there.


@dataclass(frozen=True)
class Outcome:
    """The version an operation wrote, or the newest one when nothing changed."""

    record: VersionRecord
    changed: bool = True


@dataclass(frozen=True)
class ToolSummary:
    tool: str
    newest: IndexEntry
    enforced: IndexEntry | None  # the version load() returns, if any
    versions: int = 1


def _now() -> datetime:
    return datetime.now(UTC)


class Registry:
    """The registry over ``storage``.

    ``generations`` keeps the highest index generation accepted from this registry (a
    reader refuses a lower one; a writer refuses to write over one). ``trust`` is what a
    writer accepts the current index's signature from besides its own key (another
    signer's key, while keys are rotated); a writer given one must also sign what it
    writes, since readers that trust those keys refuse anything unsigned. Readers take
    their trust store per call.
    ``index_ttl`` is how long an index signed here stays valid.
    """

    def __init__(self, storage: Storage, clock: Callable[[], datetime] = _now, *,
                 generations: Generations | None = None, trust: TrustStore | None = None,
                 index_ttl: timedelta = DEFAULT_INDEX_TTL) -> None:
        if index_ttl <= timedelta(0):
            raise RegistryError("invalid", "the index TTL (--index-ttl) must be longer than 0")
        self.storage = storage
        self.clock = clock
        self.generations = generations
        self.trust = trust
        self.index_ttl = index_ttl

    # ---- reading ---------------------------------------------------------------------

    def read_index(self, must_exist: bool = False) -> RegistryIndex:
        data = self.storage.read_index()
        if data is None and must_exist:
            raise RegistryError("not_found", f"no registry at {self.storage.location()}: "
                                "publish something first, or fix --registry")
        try:
            return parse_index(data)
        except FormatError as exc:
            raise RegistryError("tampered", f"{self.storage.location()}: {exc}") from exc

    def _index(self, must_exist: bool = False) -> Index:
        return self.read_index(must_exist).tools

    def _floor(self, min_generation: int | None) -> Floor:
        kept = self.generations.floor(self.storage.location()) if self.generations else 0
        given = min_generation or 0
        if self.generations is not None and kept > 0 and kept >= given:
            return Floor(kept, self.generations.source)
        return Floor(given, "the --min-generation given") if given else Floor()

    def _index_problems(self, index: RegistryIndex, trust: TrustStore | None,
                        min_generation: int | None) -> builtins.list[Problem]:
        return check_index(index, self.storage.location(), trust, self.clock(),
                           self._floor(min_generation))

    def _accept(self, index: RegistryIndex, trust: TrustStore | None) -> None:
        """Remember a generation whose index verified against a trusted key (never an
        unsigned one: anybody could have written that number)."""
        if self.generations is not None and trust is not None and index.signature is not None:
            self.generations.accept(self.storage.location(), index.generation)

    def _entries(self, tool: str) -> Entries:
        index = self._index(must_exist=True)
        entries = index.get(tool)
        if not entries:
            close = difflib.get_close_matches(tool, list(index), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise RegistryError("not_found", f"{tool} is not in the registry at "
                                f"{self.storage.location()}{hint}")
        return entries

    @staticmethod
    def _entry(tool: str, entries: Entries, version: int) -> IndexEntry:
        for e in entries:
            if e.version == version:
                return e
        raise RegistryError("not_found", f"{tool} has no version {version} "
                            f"(it has v1 to v{entries[-1].version})")

    def _record(self, tool: str, version: int) -> VersionRecord:
        try:
            return VersionRecord.from_json(self.storage.read_version(tool, version))
        except FormatError as exc:
            raise RegistryError("tampered", f"{tool} v{version} "
                                f"({self.storage.location(tool, version)}): {exc}") from exc

    def _checked(self, tool: str, entry: IndexEntry, trust: TrustStore | None) -> tuple[
            ToolManifest | None, builtins.list[Problem]]:
        where = self.storage.location(tool, entry.version)
        try:
            data = self.storage.read_version(tool, entry.version)
        except RegistryError as exc:
            return None, [Problem(tool, entry.version, where, exc.code, exc.message)]
        return check_version(tool, entry, data, where, trust)

    def _checked_record(self, tool: str, entry: IndexEntry) -> VersionRecord:
        """A stored version to build on, refused if it no longer matches its checksum."""
        _, problems = self._checked(tool, entry, None)
        if problems:
            raise problems[0].error()
        return self._record(tool, entry.version)

    @staticmethod
    def _enforced(entries: Sequence[IndexEntry]) -> IndexEntry | None:
        return next((e for e in reversed(entries) if e.lifecycle != "draft"), None)

    def enforced(self, tool: str) -> IndexEntry | None:
        """The version of ``tool`` that ``load`` returns (the newest non-draft), if any."""
        return self._enforced(self._index().get(tool, []))

    def version(self, tool: str, version: int) -> VersionRecord:
        """One stored version of ``tool`` (not_found naming the versions there are)."""
        return self._record(tool, self._entry(tool, self._entries(tool), version).version)

    def history(self, tool: str) -> builtins.list[VersionRecord]:
        return [self._record(tool, e.version) for e in self._entries(tool)]

    def diff(self, tool: str, a: int, b: int) -> str:
        """A unified diff of the two versions' manifests as pretty, key-sorted JSON."""
        texts = [json.dumps(self.version(tool, n).manifest, indent=2, sort_keys=True,
                            ensure_ascii=False).splitlines(keepends=True) for n in (a, b)]
        return "".join(difflib.unified_diff(texts[0], texts[1], f"{tool}@v{a}", f"{tool}@v{b}"))

    def list(self) -> builtins.list[ToolSummary]:
        return [ToolSummary(tool, entries[-1], self._enforced(entries), len(entries))
                for tool, entries in sorted(self._index().items()) if entries]

    def verify(self, trust: TrustStore | None = None,
               min_generation: int | None = None) -> builtins.list[Problem]:
        """The index (signature, expiry and generation, with a trust store), every version
        file the index does not list, and every listed version: file present, checksum,
        index agreement, signature."""
        present = self.storage.list_versions()  # before the index: a writer adds files first
        index = self.read_index(must_exist=True)
        problems = self._index_problems(index, trust, min_generation)
        listed = index.listed()
        problems.extend(_unlisted(tool, version, where) for tool, version, where in present or []
                        if (tool, version) not in listed)
        for tool, entries in sorted(index.tools.items()):
            for entry in entries:
                problems.extend(self._checked(tool, entry, trust)[1])
        if not problems:
            self._accept(index, trust)
        return problems

    def load(self, trust: TrustStore | None = None,
             min_generation: int | None = None) -> dict[str, ToolManifest]:
        """The enforceable registry: the newest non-draft version of each tool, each checked
        (and, with a trust store, the index and each version required to carry a trusted
        signature, the index unexpired), all-or-nothing. The index is checked first: it is
        what says which versions there are."""
        index = self.read_index(must_exist=True)
        problems = self._index_problems(index, trust, min_generation)
        if problems:
            raise problems[0].error()
        loaded: dict[str, ToolManifest] = {}
        for tool, entries in sorted(index.tools.items()):
            entry = self._enforced(entries)
            if entry is None:
                continue  # only drafts: absent, exactly like a tool with no manifest
            manifest, problems = self._checked(tool, entry, trust)
            if problems or manifest is None:
                raise problems[0].error()
            loaded[tool] = manifest
        issues = validate_set(list(loaded.values()))
        if issues:
            raise RegistryError("invalid", "the registry's enforceable versions do not form a "
                                "valid set: " + "; ".join(str(i) for i in issues))
        self._accept(index, trust)
        return loaded

    def sign_index(self, key: Ed25519PrivateKey) -> RegistryIndex:
        """Sign the index as it is (a new generation, a fresh expiry): for a registry
        written before signed indexes, and on a schedule, before the index expires. Refused
        while ``verify`` (without a trust store) finds a problem: what is signed is what a
        reader will trust."""
        problems = self.verify(None)
        if problems:
            raise RegistryError(problems[0].code, (
                f"not signing {self.storage.location()}: {len(problems)} "
                f"{'problem' if len(problems) == 1 else 'problems'}, the first: "
                f"{problems[0]}; run `unwind manifests verify` and fix them first"))
        return self._update_index(key)

    # ---- writing ---------------------------------------------------------------------

    def publish(self, sources: Iterable[Source], by: str, status: str = "draft",
                key: Ed25519PrivateKey | None = None, note: str | None = None) -> builtins.list[Outcome]:
        """Add manifests (files, folders, models or mappings) as new versions with lifecycle
        ``status``; a manifest equal to its tool's newest version is reported unchanged."""
        if status not in ("draft", "approved"):
            raise RegistryError("invalid", f"--status must be draft or approved, not {status!r}")
        manifests = read_sources(sources)
        index = self._index()
        planned = [self._normalize(m.canonical_dict(), _next(index.get(m.tool)), status)
                   for m in manifests]
        self._check_set(planned, index, enforceable=status != "draft")
        outcomes = []
        for m in planned:
            record = self._new_record(m, by, "publish", note, index.get(m.tool),
                                      approved_by=by if status == "approved" else None)
            outcomes.append(self._write(record, index, key))
        return outcomes

    def approve(self, tool: str, by: str, version: int | None = None, four_eyes: bool = False,
                key: Ed25519PrivateKey | None = None, note: str | None = None) -> Outcome:
        entries = self._entries(tool)
        entry = entries[-1] if version is None else self._entry(tool, entries, version)
        if entry.lifecycle != "draft":
            hint = "" if version is not None else "; name an older draft with --version"
            raise RegistryError("not_draft", f"{tool} v{entry.version} is {entry.lifecycle}, "
                                f"not a draft: there is nothing to approve{hint}")
        source = self._checked_record(tool, entry)
        if four_eyes and source.by == by:
            raise RegistryError("four_eyes", f"{tool} v{entry.version} was written by {by}, who "
                                "may not approve it with --four-eyes: ask another person")
        return self._derive(source, entries, by, "approve", "approved", {},
                            note or f"approved from v{entry.version}", key,
                            author=source.by, approved_by=by)

    def deprecate(self, tool: str, by: str, replaced_by: str | None = None,
                  key: Ed25519PrivateKey | None = None, note: str | None = None) -> Outcome:
        index = self._index()
        entries = self._entries(tool)
        entry = self._enforced(entries)
        if entry is None:
            raise RegistryError("no_approved_version", f"{tool} has no approved version to "
                                "deprecate: approve it first (a draft is not in force)")
        if replaced_by is not None and self._enforced(index.get(replaced_by, [])) is None:
            raise RegistryError("not_found", f"{tool} cannot be replaced by {replaced_by}: it has "
                                "no approved version in the registry")
        source = self._checked_record(tool, entry)
        default = f"deprecated from v{entry.version}" + (f", use {replaced_by}" if replaced_by else "")
        return self._derive(source, entries, by, "deprecate", "deprecated",
                            {"replaced_by": replaced_by}, note or default, key,
                            author=by, approved_by=source.approved_by)

    def rollback(self, tool: str, n: int, by: str, key: Ed25519PrivateKey | None = None,
                 note: str | None = None) -> Outcome:
        """Publish version ``n`` again as the newest version; nothing is removed."""
        entries = self._entries(tool)
        source = self._checked_record(tool, self._entry(tool, entries, n))
        return self._derive(source, entries, by, "rollback", source.lifecycle, {},
                            note or f"rollback to v{n}", key, author=by,
                            approved_by=source.approved_by)

    def _derive(self, source: VersionRecord, entries: Entries, by: str, action: str,
                lifecycle: str, changes: dict[str, Any], note: str,
                key: Ed25519PrivateKey | None, author: str, approved_by: str | None) -> Outcome:
        data = {k: v for k, v in {**source.manifest, **changes}.items() if v is not None}
        manifest = self._normalize(data, _next(entries), lifecycle)
        index = self._index()
        self._check_set([manifest], index, enforceable=lifecycle != "draft")
        record = self._new_record(manifest, author, action, note, entries, approved_by,
                                  source.version)
        return self._write(record, index, key)

    @staticmethod
    def _normalize(data: dict[str, Any], version: int, lifecycle: str) -> ToolManifest:
        manifest, issues = validate_manifest({**data, "version": version, "lifecycle": lifecycle})
        if manifest is None or issues:
            raise RegistryError("invalid", "; ".join(str(i) for i in issues))
        return manifest

    def _check_set(self, written: builtins.list[ToolManifest], index: Index,
                   enforceable: bool) -> None:
        """Validate what is written together with the other tools as they would then be
        seen: drafts are checked against every tool's newest version, enforceable
        versions against what ``load`` would return. Only the written tools' issues count:
        a problem elsewhere is not this operation's to fix."""
        names = {m.tool for m in written}
        others: builtins.list[ToolManifest] = []
        for tool, entries in sorted(index.items()):
            entry = self._enforced(entries) if enforceable else (entries[-1] if entries else None)
            if tool in names or entry is None:
                continue
            manifest, _ = self._checked(tool, entry, None)
            if manifest is not None:
                others.append(manifest)
        issues = [i for i in validate_set([*written, *others]) if i.tool in names]
        if issues:
            raise RegistryError("invalid", "; ".join(str(i) for i in issues))

    def _new_record(self, manifest: ToolManifest, by: str, action: str, note: str | None,
                    entries: Entries | None, approved_by: str | None = None,
                    source_version: int | None = None) -> VersionRecord:
        if not by.strip():
            raise RegistryError("invalid", "who made the change is required: pass --by")
        data = manifest.canonical_dict()
        return VersionRecord(
            tool=manifest.tool, version=manifest.version, lifecycle=str(manifest.lifecycle),
            checksum=checksum(data), created=self.clock().strftime("%Y-%m-%dT%H:%M:%SZ"),
            by=by, action=action, manifest=data, approved_by=approved_by, note=note,
            source_version=source_version)

    def _write(self, record: VersionRecord, index: Index,
               key: Ed25519PrivateKey | None) -> Outcome:
        entries = index.get(record.tool, [])
        if entries and self._same_as_newest(record, entries[-1]):
            return Outcome(self._record(record.tool, entries[-1].version), changed=False)
        self._check_writable(self.read_index(), key)  # before the version file is made
        if key is not None:
            record = replace(record, signature=sign(key, record.message))
        self.storage.write_version(record.tool, record.version, record.to_json())
        self._update_index(key, record.tool, [*entries, record.index_entry()])
        return Outcome(record)

    def _same_as_newest(self, record: VersionRecord, newest: IndexEntry) -> bool:
        """Nothing to write: the newest version already says the same (version number and
        lifecycle aside) and is as far along: the same lifecycle, or, for a draft, any
        (publishing approved content again as a draft is not a new draft). So running the
        same publish twice, before or after an approval, is harmless."""
        if record.lifecycle not in (newest.lifecycle, "draft"):
            return False
        if newest.lifecycle == record.lifecycle:  # the cheap check, without reading the file
            return checksum({**record.manifest, "version": newest.version}) == newest.checksum
        stored = self._record(record.tool, newest.version).manifest
        keep = {k: v for k, v in record.manifest.items() if k not in ("version", "lifecycle")}
        return keep == {k: v for k, v in stored.items() if k not in ("version", "lifecycle")}

    def _update_index(self, key: Ed25519PrivateKey | None, tool: str | None = None,
                      entries: Entries | None = None) -> RegistryIndex:
        """Write the next generation of the index, with ``tool``'s entries replaced, signed
        with ``key``. The current index is re-read and re-checked under the storage's lock:
        only this tool's entries come from what this writer read earlier, so concurrent
        writers of other tools are kept."""
        written: builtins.list[RegistryIndex] = []

        def change(document: Any) -> dict[str, Any]:
            try:
                current = parse_index(document)
            except FormatError as exc:
                raise RegistryError("tampered", f"{self.storage.location()}: {exc}: not "
                                    "writing over it") from exc
            self._check_writable(current, key)
            tools = dict(current.document.get("tools", {}))
            if tool is not None and entries is not None:
                tools[tool] = [e.to_json() for e in entries]
            new = new_index_document(current, tools)
            if key is not None:
                new["expires"] = format_time(self.clock() + self.index_ttl)
                new["signature"] = sign(key, index_message(new)).to_json()
            written.append(parse_index(new))
            return new

        self.storage.update_index(change)
        if key is not None and self.generations is not None:
            self.generations.accept(self.storage.location(), written[0].generation)
        return written[0]

    def _check_writable(self, current: RegistryIndex, key: Ed25519PrivateKey | None) -> None:
        """Refuse to write over an index this writer cannot vouch for: an older generation
        than one accepted before, or a signed index whose signature does not verify against
        the writer's key or a trusted key (re-signing it would launder whatever was changed).
        An unsigned index may be written over; the first keyed write signs it. And refuse an
        unsigned write while a trusted key is set: readers would refuse what it writes, so
        it is better found out here than by the next `verify` or gateway load."""
        where = self.storage.location()
        if key is None and self.trust is not None and self.trust.keys:
            raise RegistryError("key_required", (
                f"a trusted key is set ({len(self.trust.keys)} "
                f"{'key' if len(self.trust.keys) == 1 else 'keys'}), so every reader would "
                f"refuse an unsigned version of {where}: pass --key to sign it (or, for a "
                "registry that is meant to be unsigned, unset the trusted keys)"))
        floor = self._floor(None)
        if current.generation < floor.generation:
            raise RegistryError("index_rollback", (
                f"{where} has generation {current.generation}, lower than generation "
                f"{floor.generation} accepted before ({floor.source}): not writing over an "
                "older copy of the registry; restore the current index first"))
        if current.signature is None:
            return
        kid = current.signature.key_id
        if key is None:
            raise RegistryError("key_required", (
                f"{where} is signed (key {kid}): a write without --key would leave it "
                "unsigned, and every reader that trusts a key would refuse the registry; "
                "pass --key"))
        known = TrustStore([key.public_key()])
        known.keys.update(self.trust.keys if self.trust is not None else {})
        code = known.check(current.message, current.signature)
        if code == "untrusted":
            raise RegistryError("untrusted_index", (
                f"{where} is signed by key {kid}, which is neither the --key given nor a "
                "trusted key: pass --trust with that key's public key (when rotating keys), "
                "or find out who signed it before writing over it"))
        if code == "bad_signature":
            raise RegistryError("bad_index_signature", (
                f"{where}: the index's signature does not verify, so it was changed after it "
                "was signed; find out what changed (git log -p index.json, `unwind manifests "
                "verify`) before writing over it. To accept it as it is now, delete its "
                "\"signature\" field and run `unwind manifests sign-index`"))


def _unlisted(tool: str, version: int, where: str) -> Problem:
    return Problem(tool, version, where, "unlisted_version", (
        "the file is present but index.json does not list this version: the index was cut "
        "back to older versions (a rollback), or a write failed before it updated the index; "
        "compare with the registry's history (git log -p index.json) and restore the index "
        "that lists it, or remove the file if it was never published"))


def _next(entries: Entries | None) -> int:
    return entries[-1].version + 1 if entries else 1
