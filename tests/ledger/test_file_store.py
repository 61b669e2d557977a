"""The local ledger file: the EffectLedger object, atomic writes, paging, locks across processes."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from unwind.ledger.entry import Entry, Times
from unwind.ledger.filestore import FileLocks, FileStore, LedgerDirError
from unwind.ledger.lifecycle import Expect, Write
from unwind.ledger.store import EntryExists, Holder, NotOwner, RunFull, Stale, StoreUnavailable


def entry(id_: str, state: str = "pending") -> Entry:
    return Entry(id=id_, tool="t", actor="me", state=state,  # type: ignore[arg-type]
                 times=Times(requested="2026-11-30T10:00:00.000Z"))


def test_a_ledger_file_holds_the_effect_ledger_object(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.create_sync("run-1", entry("e1"))
    obj = json.loads((tmp_path / "run-1.json").read_text())
    assert list(obj) == ["apiVersion", "kind", "metadata", "spec", "status"]
    assert obj["apiVersion"] == "unwind.dev/v1alpha1" and obj["kind"] == "EffectLedger"
    assert obj["metadata"]["name"] == "run-1"
    assert obj["spec"] == {"run": "run-1", "page": 1, "owner": "me"}
    assert len(obj["metadata"]["uid"]) == 36  # a UUID, as the API server gives every object
    assert obj["status"]["entries"][0]["id"] == "e1"
    assert obj["status"]["entries"][0]["seq"] == 1
    assert obj["status"]["entryCount"] == 1 and obj["status"]["lastState"] == "pending"


def test_creating_an_entry_twice_names_the_one_already_there(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.create_sync("run-1", entry("e1"))
    with pytest.raises(EntryExists) as caught:
        store.create_sync("run-1", entry("e1", "refused"))
    assert caught.value.entry.state == "pending"


def test_an_update_applies_its_change_and_a_stale_change_writes_nothing(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.create_sync("run-1", entry("e1"))
    store.transition_sync("run-1", "e1", Write("gateway", Expect("pending"),
                                              lambda e: e.model_copy(update={"state": "succeeded"})))

    def failed(e: Entry) -> Entry:
        return e.model_copy(update={"state": "failed"})

    with pytest.raises(Stale):  # the gateway read it pending: a compare-and-set (lifecycle)
        store.transition_sync("run-1", "e1", Write("gateway", Expect("pending"), failed))
    assert FileStore(tmp_path).get_sync("run-1", "e1").state == "succeeded"  # type: ignore[union-attr]


def test_a_full_page_continues_in_a_linked_page(tmp_path: Path) -> None:
    store = FileStore(tmp_path, page_bytes=600)
    for n in range(4):
        store.create_sync("run-1", entry(f"e{n}"))
    first = json.loads((tmp_path / "run-1.json").read_text())
    assert first["status"]["next"] == "run-1.p2"
    second = json.loads((tmp_path / "run-1.p2.json").read_text())
    assert second["spec"] == {"run": "run-1", "page": 2}
    fresh = FileStore(tmp_path, page_bytes=600)
    assert [e.seq for e in fresh.entries_sync("run-1")] == [1, 2, 3, 4]
    assert fresh.get_sync("run-1", "e3") is not None
    store.transition_sync("run-1", "e0", Write("gateway", Expect("pending"),
                                              lambda e: e.model_copy(update={"state": "succeeded"})))
    assert fresh.get_sync("run-1", "e0").state == "succeeded"  # type: ignore[union-attr]


def test_a_ledger_that_cannot_be_read_makes_the_store_unavailable(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    (tmp_path / "run-1.json").mkdir()
    with pytest.raises(StoreUnavailable, match=r"run-1\.json"):
        store.create_sync("run-1", entry("e1"))
    (tmp_path / "run-2.json").write_text('{"kind": "ConfigMap"}')
    with pytest.raises(StoreUnavailable, match="not an EffectLedger"):
        store.get_sync("run-2", "e1")


def test_a_folder_that_cannot_be_written_is_refused_with_a_message(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(LedgerDirError, match="is not writable"):
        FileStore(blocker / "ledger")


def _append_many(root: str, worker: int) -> None:
    store = FileStore(root)
    for n in range(25):
        store.create_sync("run-1", entry(f"w{worker}-{n}"))


def test_two_processes_appending_to_one_run_lose_no_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    entries = FileStore(tmp_path).entries_sync("run-1")
    assert len(entries) == 50
    assert sorted(e.seq for e in entries) == list(range(1, 51))
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


def test_a_key_lock_has_one_holder_until_it_is_released(tmp_path: Path) -> None:
    locks = FileLocks(tmp_path)
    a, b = Holder("run-1", "e1", "2026-11-30T10:00:00.000Z"), Holder("run-1", "e2", "2026-11-30T10:00:01.000Z")
    assert locks.acquire_sync("k", a) is None
    assert locks.acquire_sync("k", b) == a
    assert not locks._remove_if("k", b)
    assert locks._remove_if("k", a)
    assert locks.acquire_sync("k", b) is None


def test_a_run_takes_entries_only_of_the_actor_whose_entry_created_it(tmp_path: Path) -> None:
    store = FileStore(tmp_path, page_bytes=400)
    store.create_sync("run-1", entry("e1"))
    for n in range(2, 5):
        store.create_sync("run-1", entry(f"e{n}"))  # past the first page: page 1 keeps the owner
    intruder = entry("x1").model_copy(update={"actor": "someone-else"})
    with pytest.raises(NotOwner) as caught:
        FileStore(tmp_path).create_sync("run-1", intruder)
    assert caught.value.owner == "me"
    with pytest.raises(NotOwner):
        store.transition_sync("run-1", "e1", Write("gateway", Expect("pending"), lambda e: e.model_copy(
            update={"state": "succeeded", "actor": "someone-else"})))
    assert [e.actor for e in store.entries_sync("run-1")] == ["me"] * 4


def test_a_ledger_written_before_owners_is_owned_by_its_first_entrys_actor(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    store.create_sync("run-1", entry("e1"))
    path = tmp_path / "run-1.json"
    obj = json.loads(path.read_text())
    del obj["spec"]["owner"]
    path.write_text(json.dumps(obj))
    with pytest.raises(NotOwner):
        FileStore(tmp_path).create_sync("run-1", entry("x1").model_copy(update={"actor": "other"}))
    FileStore(tmp_path).create_sync("run-1", entry("e2"))


def test_a_run_takes_no_entry_past_its_limit(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    for n in range(3):
        store.create_sync("run-1", entry(f"e{n}"), max_entries=3)
    with pytest.raises(RunFull):
        store.create_sync("run-1", entry("e3"), max_entries=3)
    assert len(store.entries_sync("run-1")) == 3


def test_two_gateways_first_calls_on_a_brand_new_run_leave_it_to_exactly_one_actor(
        tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    def first_call(args: tuple[str, str]) -> str:
        run, actor = args
        try:  # a store of its own, as another process would have
            FileStore(tmp_path).create_sync(run, entry(f"by-{actor}").model_copy(update={"actor": actor}))
            return "created"
        except NotOwner:
            return "refused"

    for n in range(10):
        with ThreadPoolExecutor(2) as pool:
            outcomes = list(pool.map(first_call, [(f"new-{n}", "a"), (f"new-{n}", "b")]))
        assert sorted(outcomes) == ["created", "refused"]
        [only] = FileStore(tmp_path).entries_sync(f"new-{n}")
        assert json.loads((tmp_path / f"new-{n}.json").read_text())["spec"]["owner"] == only.actor
