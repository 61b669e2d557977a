"""Where a plan's inputs come from: a ledger (a file of the local gateway, a saved
``kubectl get effectledger -o json``, or the cluster) with all its pages, and the manifests.

A run's ledger may span pages (``<run>.json``, then ``<run>.p2.json``... linked by
``status.next``; in a cluster, objects ``<run>``, ``<run>.p2``...). Every page is read, and
each must be the next page of the same run, so a plan never silently covers half a run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..ledger.entry import Entry
from ..ledger.filestore import journal_path, read_run
from ..ledger.plan import Versions
from ..ledger.store import StoreUnavailable
from ..manifest.canonical import checksum
from ..manifest.loader import check_paths, load_paths
from ..manifest.model import ToolManifest
from ..manifest.validate import validate_manifest

MAX_PAGES = 10_000
ENTRIES = TypeAdapter(list[Entry])  # a page's entries at once: faster than one by one


class SourceError(Exception):
    """A ledger or manifest input cannot be used; the message names it and what to do."""


@dataclass
class Snapshot:
    """One run's ledger as read: its name (the first page's metadata.name), its run, and
    the entries of every page in order."""

    name: str
    run: str
    entries: list[Entry]
    pages: list[dict[str, Any]]
    source: str


Follow = Callable[[str], "dict[str, Any] | None"]


def read_ledger_file(path: str | os.PathLike[str]) -> Snapshot:
    """A ledger file and the pages it links to (``<next>.json`` beside it), or a saved
    ``kind: List`` of pages."""
    p = Path(path)
    data = _json_file(p)
    if isinstance(data, dict) and data.get("kind") == "List":
        items = data.get("items")
        if not isinstance(items, list) or not items:
            raise SourceError(f"{p}: a List with no items: save the run's EffectLedger pages")
        pages = sorted((i for i in items if isinstance(i, dict)), key=_page_number)
        return snapshot(pages, str(p), follow=None)

    run = (data.get("spec") or {}).get("run") if isinstance(data, dict) else None
    if isinstance(run, str) and p.name == f"{run}.json" and _has_journal(p.parent, run):
        try:  # a local gateway's ledger: its latest entries may still be in the journal
            return snapshot(read_run(p.parent, run), str(p), follow=None)
        except StoreUnavailable as exc:
            raise SourceError(f"{p}: {exc}") from None

    def follow(name: str) -> dict[str, Any] | None:
        nxt = p.parent / f"{name}.json"
        return _json_file(nxt) if nxt.exists() else None
    return snapshot([data], str(p), follow)


def _has_journal(folder: Path, run: str) -> bool:
    try:
        return journal_path(folder, run).stat().st_size > 0
    except OSError:
        return False


def snapshot(first: list[Any], source: str, follow: Follow | None) -> Snapshot:
    """Check the pages (following ``status.next`` with ``follow`` when given) and read the
    entries."""
    pages: list[dict[str, Any]] = []
    pending = list(first)
    while pending:
        obj = pending.pop(0)
        where = f"{source} (page {len(pages) + 1})"
        page = _page(obj, where)
        if pages and page["spec"]["run"] != pages[0]["spec"]["run"]:
            raise SourceError(f"{where}: belongs to run {page['spec']['run']}, not "
                              f"{pages[0]['spec']['run']}")
        if page["spec"].get("page", 1) != len(pages) + 1:
            raise SourceError(f"{where}: holds page {page['spec'].get('page', 1)}; expected page "
                              f"{len(pages) + 1} (are pages missing?)")
        pages.append(page)
        nxt = (page.get("status") or {}).get("next")
        if nxt and not pending:
            if follow is None:
                raise SourceError(f"{where}: continues in {nxt}, which was not given: save all "
                                  "the run's pages")
            if len(pages) >= MAX_PAGES:
                raise SourceError(f"{source}: more than {MAX_PAGES} pages")
            found = follow(nxt)
            if found is None:
                raise SourceError(f"{where}: continues in {nxt}, which cannot be found: a "
                                  "ledger's pages belong together")
            pending.append(found)
    entries: list[Entry] = []
    for number, page in enumerate(pages, 1):
        try:
            entries += ENTRIES.validate_python((page.get("status") or {}).get("entries") or [])
        except ValidationError as exc:
            err = exc.errors()[0]
            index, *rest = err["loc"] or ("?",)
            field = "".join(f".{x}" for x in rest)
            raise SourceError(f"{source} (page {number}): status.entries[{index}]{field}: "
                              f"{err['msg']}") from None
    name = str(pages[0]["metadata"].get("name") or pages[0]["spec"]["run"])
    return Snapshot(name, str(pages[0]["spec"]["run"]), entries, pages, source)


def _page(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict) or obj.get("kind") != "EffectLedger":
        kind = obj.get("kind") if isinstance(obj, dict) else type(obj).__name__
        raise SourceError(f"{where}: not an EffectLedger (kind {kind!r}): give a ledger file of "
                          "the local gateway or `kubectl get effectledger NAME -o json` saved")
    spec = obj.get("spec")
    if not isinstance(spec, dict) or not isinstance(spec.get("run"), str):
        raise SourceError(f"{where}: spec.run is missing: not a ledger page")
    if not isinstance(obj.get("metadata"), dict):
        raise SourceError(f"{where}: metadata is missing: not a ledger page")
    return obj


def _page_number(obj: dict[str, Any]) -> int:
    spec = obj.get("spec")
    page = spec.get("page", 1) if isinstance(spec, dict) else 1
    return page if isinstance(page, int) else 1


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        raise SourceError(f"{path}: no such ledger file; the local gateway writes one per run as "
                          "<its --ledger-dir>/<run>.json, and `kubectl get effectledger NAME -o json > FILE` "
                          "saves one from a cluster") from None
    except OSError as exc:
        raise SourceError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise SourceError(f"{path}: not JSON ({exc})") from None


# ---- manifests ----

def load_versions(manifests: Sequence[str], versions: Sequence[str] = (), *,
                  current: bool = False, rewrite: Sequence[tuple[str, str]] = ()) -> Versions:
    """Today's set from ``manifests`` (validated as one set, as the local gateway loads
    it), plus older versions from ``versions`` (each validated alone), all by checksum.
    ``rewrite``: upstream URL prefixes moved as the local gateway's ``--rewrite-upstream``
    moves them (the checksum stays the file's)."""
    from ..manifest.rewrite import rewrite_upstream

    result = check_paths(manifests, one_set=True)
    where = ", ".join(manifests)
    if not result.ok:
        first = "; ".join(str(i) for i in result.issues[:3])
        more = f" (and {len(result.issues) - 3} more)" if len(result.issues) > 3 else ""
        raise SourceError(f"the manifests in {where} are not valid: {first}{more}; `unwind "
                          "validate` lists every problem")
    if not result.manifests:
        raise SourceError(f"no tool manifest found in {where}")
    by_checksum: dict[str, ToolManifest] = {}
    for path in versions:
        loaded = load_paths([path])
        if loaded.errors:
            raise SourceError(f"--versions {path}: {loaded.errors[0]}")
        for item in loaded.items:
            m, issues = validate_manifest(item.data)
            if m is None or issues:
                shown = issues[0] if issues else "not a manifest"
                raise SourceError(f"--versions {item.file or path}: {shown}")
            by_checksum[checksum(m)] = rewrite_upstream(m, rewrite)
    tools = {m.tool: rewrite_upstream(m, rewrite) for m in result.manifests}
    by_checksum.update({checksum(m): tools[m.tool] for m in result.manifests})
    return Versions(by_checksum, tools, current)
