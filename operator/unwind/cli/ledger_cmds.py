"""`unwind ledger list` and `unwind ledger show RUN`: a local gateway's runs, read from the
folder it writes (``--ledger-dir``): each run's pages with its journal's records applied
(``read_run``, the reader every ledger command uses), so an entry a call wrote a moment
ago is shown before the journal is folded into the page. What is printed is decided in
ledger_view.py; ``-o json`` is the run's pages as a List, the document ``kubectl get
effectledger -l unwind.dev/run=RUN -o json`` gives, which `unwind plan --ledger` reads.
``--follow`` prints a row again each time it changes, as ``kubectl get -w`` does, until
interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import ledger_view as view
from .output import add_output_flags, emit, fail, output_format

FOLLOW_EVERY_S = 0.5
Rows = dict[str, tuple[Any, ...]]


class _Problem(Exception):
    pass


def _folder(args: argparse.Namespace) -> Path:
    folder = Path(args.ledger_dir or os.environ.get("UNWIND_LEDGER_DIR") or ".ledger")
    if not folder.is_dir():
        raise _Problem(f"no ledger folder {folder}: give --ledger-dir DIR, the folder "
                       "`unwind gateway --ledger-dir` writes (or set UNWIND_LEDGER_DIR)")
    return folder


def runs_in(folder: Path) -> list[str]:
    """The runs a folder holds: ``<run>.json`` first pages and ``<run>.journal`` journals
    (run names have no dot; later pages are ``<run>.p2.json``)."""
    names = {p.stem for p in folder.glob("*.json") if "." not in p.stem}
    names |= {p.stem for p in folder.glob("*.journal") if "." not in p.stem}
    return sorted(names)


def _pages(folder: Path, run: str) -> list[dict[str, Any]]:
    from ..ledger.filestore import read_run
    from ..ledger.store import StoreUnavailable

    try:
        return list(view.with_live(read_run(folder, run)))
    except StoreUnavailable as exc:
        raise _Problem(str(exc)) from None


def _all_pages(folder: Path) -> list[dict[str, Any]]:
    return [page for run in runs_in(folder) for page in _pages(folder, run)]


def _run_pages(folder: Path, run: str) -> list[dict[str, Any]]:
    from ..ledger.store import run_problem

    problem = run_problem(run)
    if problem:
        raise _Problem(problem)
    pages = _pages(folder, run)
    if not pages:
        known = runs_in(folder)
        raise _Problem(f"no run {run} in {folder} ({'its runs: ' + ', '.join(known[:20]) if known else 'it holds no run yet'})")
    return pages


def _now() -> Any:
    from ..ledger.entry import now

    return now()


def cmd_ledger_list(args: argparse.Namespace) -> int:
    try:
        folder = _folder(args)
        pages = _all_pages(folder)
    except _Problem as exc:
        return fail(args, "ledger", str(exc))
    fmt = output_format(args)
    if fmt != "text":
        emit(view.as_list(pages), fmt)
    elif not pages:
        print(f"No runs in {folder}.", file=sys.stderr)
    else:
        print(view.ledger_table(pages, _now(), args.wide), flush=True)
    if not args.follow:
        return 0

    def rows() -> Rows:
        return {str(p["metadata"]["name"]): view.ledger_row(p, _now(), args.wide)
                for p in _all_pages(folder)}
    return _follow(rows, view.ledger_headers(args.wide), fmt, lambda: _all_pages(folder))


def cmd_ledger_show(args: argparse.Namespace) -> int:
    try:
        folder = _folder(args)
        pages = _run_pages(folder, args.run)
    except _Problem as exc:
        return fail(args, "ledger", str(exc))
    fmt = output_format(args)
    if fmt != "text":
        emit(view.as_list(pages), fmt)
    else:
        print(view.run_text(pages, _now(), args.wide), flush=True)
    if not args.follow:
        return 0

    def rows() -> Rows:
        return {str(e.get("id")): view.entry_row(e, _now())
                for e in view.entries_of(_pages(folder, args.run))}

    def entries() -> list[Mapping[str, Any]]:
        return view.entries_of(_pages(folder, args.run))
    return _follow(rows, view.ENTRY_HEADERS, fmt, entries)


def _follow(rows: Callable[[], Rows], headers: Sequence[str], fmt: str,
            objects: Callable[[], Sequence[Mapping[str, Any]]]) -> int:
    """Print what changes until interrupted: a row per new or changed item (text), or the
    item itself as one JSON line (-o json|yaml: JSON lines, as a stream needs)."""
    seen = rows()
    widths = [len(h) for h in headers]
    try:
        while True:
            time.sleep(FOLLOW_EVERY_S)
            try:
                current = rows()
            except _Problem as exc:  # a fold under way: read again next time
                print(f"note: {exc}", file=sys.stderr)
                continue
            changed = view.changed_rows(seen, current)
            if changed and fmt != "text":
                keys = {row[1] if headers is view.ENTRY_HEADERS else row[0] for row in changed}
                for obj in objects():
                    key = obj.get("id") if headers is view.ENTRY_HEADERS else (
                        obj.get("metadata") or {}).get("name")
                    if key in keys:
                        print(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
            for row in changed if fmt == "text" else ():
                cells = ["-" if c is None else str(c) for c in row]
                widths = [max(w, len(c)) for w, c in zip(widths, cells, strict=True)]
                print("   ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip())
            sys.stdout.flush()
            seen = current
    except KeyboardInterrupt:
        return 0


def register(lsub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--ledger-dir", metavar="DIR", help="the folder `unwind gateway "
                       "--ledger-dir` writes (default $UNWIND_LEDGER_DIR, else .ledger)")
        p.add_argument("-w", "--follow", action="store_true", help="go on printing what changes "
                       "(a row per change, as kubectl get -w) until interrupted")
        p.add_argument("--wide", action="store_true", help="the page's wide columns too (PAGE, "
                       "ROLLED BACK, REQUESTED BY), as kubectl get -o wide")
        add_output_flags(p)

    p = lsub.add_parser("list", help="the runs of a local ledger folder, as kubectl get "
                        "effectledger lists them", description="One row per page of every run "
                        "in the folder: NAME, RUN, ENTRIES, LAST STATE, LIVE, AGE (the "
                        "EffectLedger's printer columns). -o json: the pages as a List.")
    common(p)
    p.set_defaults(func=cmd_ledger_list)
    p = lsub.add_parser("show", help="a run's pages and entries from a local ledger folder",
                        description="The run's pages as kubectl get effectledger lists them, "
                        "then one row per entry (SEQ, ENTRY, TOOL, EFFECT, STATE, ERROR, AGE), "
                        "read from its pages and journal. -o json: the pages as a List, which "
                        "`unwind plan --ledger FILE` reads.")
    p.add_argument("run", metavar="RUN")
    common(p)
    p.set_defaults(func=cmd_ledger_show)
