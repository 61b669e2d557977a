"""The file ledger's journal: a write is one append, group-committed, folded into the page
users read, and a crash at any byte recovers to the last complete record."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from unwind.ledger.entry import Entry, Times
from unwind.ledger.filestore import FileStore, journal_path, read_run, record
from unwind.ledger.lifecycle import Expect, Write
from unwind.ledger.store import StoreUnavailable
from unwind.undo.sources import SourceError, read_ledger_file


def entry(id_: str, state: str = "pending", body: str = "") -> Entry:
    return Entry(id=id_, tool="t", actor="me", state=state,  # type: ignore[arg-type]
                 warnings=[body] if body else [], times=Times(requested="2026-11-30T10:00:00.000Z"))


def succeeded(e: Entry) -> Entry:
    return e.model_copy(update={"state": "succeeded"})


# Writes go through the entry lifecycle (ledger/lifecycle.py): the call's outcome is the
# gateway's; an edit of a pending entry's warnings stands for a lookup's record of an
# attempt, and of a succeeded one for a rollback's write-ahead of its undo.
done = Write("gateway", Expect("pending"), succeeded)


def noted(state: str, change: Callable[[Entry], Entry]) -> Write:
    if state == "pending":
        return Write("lookup", Expect("pending"), change)
    if state == "succeeded":
        return Write("rollback", Expect("succeeded"),
                     lambda e: change(e).model_copy(update={"state": "undoing"}))
    return Write("rollback", Expect("undoing"), change)  # type: ignore[arg-type]


def ids(pages: list[dict]) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    return [(e["id"], e["state"]) for p in pages for e in p["status"]["entries"]]


async def calls(store: FileStore, run: str, names: list[str]) -> None:
    """What the gateway does per call: the pending entry, then its outcome."""
    async def one(name: str) -> None:
        await store.create(run, entry(name))
        await store.transition(run, name, done)
    await asyncio.gather(*(one(n) for n in names))


async def test_a_call_appends_to_the_journal_and_leaves_the_page_alone(tmp_path: Path) -> None:
    store = FileStore(tmp_path, quiet_seconds=60)
    await calls(store, "run-1", ["first"])  # the run's first entry writes its page
    page = tmp_path / "run-1.json"
    before = page.stat()
    await calls(store, "run-1", [f"e{n}" for n in range(20)])
    after = page.stat()
    assert (after.st_ino, after.st_size) == (before.st_ino, before.st_size)
    assert journal_path(tmp_path, "run-1").stat().st_size > 0
    # every reader sees the journal's entries: a fresh store, the folder reader, the CLI's
    expected = [("first", "succeeded")] + [(f"e{n}", "succeeded") for n in range(20)]
    assert sorted(ids(read_run(tmp_path, "run-1"))) == sorted(expected)
    fresh = FileStore(tmp_path)
    assert sorted((e.id, e.state) for e in fresh.entries_sync("run-1")) == sorted(expected)
    assert sorted(e.seq for e in fresh.entries_sync("run-1")) == list(range(1, 22))
    assert len(read_ledger_file(page).entries) == 21
    await store.aclose()  # the gateway stops: the journal is folded into the page
    assert journal_path(tmp_path, "run-1").stat().st_size == 0
    assert sorted(ids([json.loads(page.read_text())])) == sorted(expected)


async def test_calls_that_arrive_together_share_one_fsync_and_outcomes_wait_for_the_next(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path, quiet_seconds=60)
    await calls(store, "run-1", ["first"])
    await calls(store, "run-1", ["second"])  # the journal exists from here on
    synced = store.fsyncs
    await calls(store, "run-1", [f"e{n}" for n in range(10)])
    assert store.fsyncs - synced <= 2  # ten write-aheads: one or two batches, not ten fsyncs
    synced = store.fsyncs
    await store.transition("run-1", "e0", noted("succeeded", lambda e: e.model_copy(update={"warnings": ["x"]})))
    assert store.fsyncs == synced  # not a write-ahead: written, synced with the next one
    assert FileStore(tmp_path).get_sync("run-1", "e0").warnings == ["x"]  # type: ignore[union-attr]


async def test_a_quiet_run_is_folded_into_its_page(tmp_path: Path) -> None:
    store = FileStore(tmp_path, quiet_seconds=0.05)
    await calls(store, "run-1", ["a", "b", "c"])
    for _ in range(100):
        await asyncio.sleep(0.02)
        if journal_path(tmp_path, "run-1").stat().st_size == 0:
            break
    page = json.loads((tmp_path / "run-1.json").read_text())
    assert sorted(ids([page])) == [("a", "succeeded"), ("b", "succeeded"), ("c", "succeeded")]
    assert page["status"]["entryCount"] == 3 and page["status"]["lastState"] == "succeeded"


async def test_a_long_journal_folds_into_linked_pages(tmp_path: Path) -> None:
    store = FileStore(tmp_path, page_bytes=2000, fold_bytes=3000, quiet_seconds=60)
    names = [f"e{n:03}" for n in range(60)]
    for name in names:
        await calls(store, "run-1", [name])
    assert (tmp_path / "run-1.p2.json").exists()
    assert journal_path(tmp_path, "run-1").stat().st_size < 3000
    assert [i for i, _ in ids(read_run(tmp_path, "run-1"))] == names
    assert [e.id for e in FileStore(tmp_path).entries_sync("run-1")] == names
    assert [e.seq for e in FileStore(tmp_path).entries_sync("run-1")] == list(range(1, 61))


def test_a_crash_at_any_byte_of_an_append_recovers_to_the_last_complete_record(
        tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.create_sync("run-1", entry("first"))
    texts = [entry(f"e{n}", body="ü" * n).model_copy(update={"seq": n + 2}).model_dump_json(
        exclude_none=True) for n in range(4)]
    data = b"".join(record(t) for t in texts)
    ends = [sum(len(record(t)) for t in texts[:k]) for k in range(len(texts) + 1)]
    journal = journal_path(tmp_path, "run-1")
    for cut in range(len(data) + 1):
        journal.write_bytes(data[:cut])
        whole = max(k for k, end in enumerate(ends) if end <= cut)
        want = ["first"] + [f"e{n}" for n in range(whole)]
        assert [i for i, _ in ids(read_run(tmp_path, "run-1"))] == want, cut
        got = FileStore(tmp_path).entries_sync("run-1")  # a writer: cuts the torn tail off
        assert [e.id for e in got] == want, cut
        assert journal.stat().st_size == ends[whole]


def test_damage_followed_by_good_records_is_refused_not_dropped(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.create_sync("run-1", entry("first"))
    texts = [entry(f"e{n}").model_copy(update={"seq": n + 2}).model_dump_json(exclude_none=True)
             for n in range(3)]
    lines = [record(t) for t in texts]
    lines[1] = lines[1].replace(b'"e1"', b'"x1"')  # its checksum no longer matches
    journal_path(tmp_path, "run-1").write_bytes(b"".join(lines))
    with pytest.raises(StoreUnavailable, match=r"run-1\.journal is damaged at byte \d+"):
        FileStore(tmp_path).entries_sync("run-1")
    with pytest.raises(SourceError, match="damaged"):
        read_ledger_file(tmp_path / "run-1.json")


def test_a_fold_cut_short_before_the_journal_is_emptied_changes_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.create_sync("run-1", entry("first"))
    texts = [entry("a").model_copy(update={"seq": 2}).model_dump_json(exclude_none=True),
             done(entry("a")).model_copy(update={"seq": 2}).model_dump_json(exclude_none=True)]
    journal = journal_path(tmp_path, "run-1")
    journal.write_bytes(b"".join(record(t) for t in texts))
    store.transition_sync("run-1", "first", done)  # a CLI write folds: the page holds a
    assert journal.stat().st_size == 0
    journal.write_bytes(b"".join(record(t) for t in texts))  # as if it crashed before emptying
    got = FileStore(tmp_path).entries_sync("run-1")
    assert [(e.id, e.state, e.seq) for e in got] == [("first", "succeeded", 1),
                                                      ("a", "succeeded", 2)]


def test_a_journal_without_its_page_is_refused_with_what_to_do(tmp_path: Path) -> None:
    FileStore(tmp_path)
    journal_path(tmp_path, "run-1").write_bytes(record(entry("a").model_dump_json()))
    with pytest.raises(StoreUnavailable, match=r"has no page run-1\.json"):
        FileStore(tmp_path).get_sync("run-1", "a")


async def test_another_process_writing_between_two_of_ours_is_read_before_ours(
        tmp_path: Path) -> None:
    ours = FileStore(tmp_path, quiet_seconds=60)
    await calls(ours, "run-1", ["a"])
    theirs = FileStore(tmp_path)  # the CLI, say: a rollback marking an entry
    theirs.transition_sync("run-1", "a", noted("succeeded", lambda e: e.model_copy(update={"warnings": ["undone"]})))
    await calls(ours, "run-1", ["b"])
    got = {e.id: e for e in FileStore(tmp_path).entries_sync("run-1")}
    assert got["a"].warnings == ["undone"] and got["b"].seq == 2
    assert (await ours.get("run-1", "a")).warnings == ["undone"]  # type: ignore[union-attr]


async def test_a_gateway_and_cli_writes_interleaved_at_random_lose_nothing(tmp_path: Path) -> None:
    """The gateway's store (journal, folds when quiet or full) and a CLI's (folds on every
    write) on one folder, in a random order: every entry and every change is read back by
    a third store, by the folder reader, and from the page once everything is folded."""
    import random
    rng = random.Random(7)
    gateway = FileStore(tmp_path, page_bytes=1500, fold_bytes=2500, quiet_seconds=60)
    expected: dict[str, list[str]] = {}
    for n in range(150):
        roll = rng.random()
        if roll < 0.5 or not expected:
            name = f"e{n}"
            await gateway.create("run-1", entry(name))
            expected[name] = []
        elif roll < 0.8:
            name = rng.choice(sorted(expected))
            expected[name].append(f"gw{n}")
            await gateway.transition("run-1", name, noted("pending", lambda e, w=f"gw{n}": e.model_copy(
                update={"warnings": [*e.warnings, w]})))
        else:
            name = rng.choice(sorted(expected))
            expected[name].append(f"cli{n}")
            FileStore(tmp_path, page_bytes=1500).transition_sync("run-1", name, noted("pending", lambda e, w=f"cli{n}": (
                e.model_copy(update={"warnings": [*e.warnings, w]}))))
    def seen(entries: list[Entry]) -> dict[str, list[str]]:
        return {e.id: e.warnings for e in entries}
    assert seen(FileStore(tmp_path).entries_sync("run-1")) == expected
    assert seen(await gateway.entries("run-1")) == expected
    folder = [Entry.model_validate(e) for p in read_run(tmp_path, "run-1") for e in p["status"]["entries"]]
    assert seen(folder) == expected
    assert sorted(e.seq for e in folder) == list(range(1, len(expected) + 1))
    await gateway.aclose()
    assert journal_path(tmp_path, "run-1").stat().st_size == 0
    pages = sorted(tmp_path.glob("run-1*.json"))
    assert len(pages) > 2  # the run spans linked pages
    on_disk = [Entry.model_validate(e) for p in pages for e in json.loads(p.read_text())["status"]["entries"]]
    assert seen(on_disk) == expected


async def test_a_cli_write_after_the_gateway_folded_is_seen_by_the_gateways_next_write(
        tmp_path: Path) -> None:
    """The journal is empty after a fold, so a CLI write changes only the page: the gateway
    must see that by the page, or its next record would bring back the entry it overwrote."""
    gateway = FileStore(tmp_path, quiet_seconds=60)
    await calls(gateway, "run-1", ["a"])
    await gateway.aclose()  # folded: the journal is empty
    FileStore(tmp_path).transition_sync("run-1", "a", noted("succeeded", lambda e: e.model_copy(update={"warnings": ["cli"]})))
    await gateway.transition("run-1", "a", noted("undoing", lambda e: e.model_copy(update={"warnings": [*e.warnings, "gw"]})))
    assert FileStore(tmp_path).get_sync("run-1", "a").warnings == ["cli", "gw"]  # type: ignore[union-attr]
