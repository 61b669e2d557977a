"""Issue 29, item 6: the file ledger opens no link and uses no folder another user writes.

Before, a symlink planted as ``<run>.journal`` made the gateway truncate the file it pointed
at, outside the ledger folder."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from unwind.ledger.entry import Entry, Times
from unwind.ledger.filestore import FileLocks, FileStore, LedgerDirError
from unwind.ledger.lifecycle import Expect, Write
from unwind.ledger.store import Holder, StoreUnavailable

ROOT = Path(__file__).resolve().parents[2]


def entry(id_: str, state: str = "pending") -> Entry:
    return Entry(id=id_, tool="t", actor="me", state=state,  # type: ignore[arg-type]
                 times=Times(requested="2026-11-30T10:00:00.000Z"))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    precious = tmp_path / "elsewhere" / "precious.txt"
    precious.parent.mkdir()
    precious.write_text("what the attacker wants destroyed\n")
    return precious


def ledger(tmp_path: Path) -> Path:
    folder = tmp_path / "ledger"
    folder.mkdir(mode=0o755)
    return folder


def test_a_symlink_planted_as_a_runs_journal_cannot_make_the_ledger_truncate_what_it_points_at(
        tmp_path: Path, outside: Path) -> None:
    folder = ledger(tmp_path)
    store = FileStore(folder)
    store.create_sync("run-1", entry("e1"))  # a CLI write: the journal is folded, empty
    journal = folder / "run-1.journal"
    journal.unlink(missing_ok=True)
    journal.symlink_to(outside)
    with pytest.raises(StoreUnavailable, match="is a symbolic link"):
        FileStore(folder).transition_sync("run-1", "e1", Write(
            "gateway", Expect("pending"), lambda e: e.model_copy(update={"state": "succeeded"})))
    gateway = FileStore(folder)  # the gateway's path: appends, from the event loop or a thread
    with pytest.raises(StoreUnavailable, match="is a symbolic link"):
        asyncio.run(gateway.create("run-1", entry("e2")))
    assert outside.read_text() == "what the attacker wants destroyed\n"
    assert journal.is_symlink()  # refused, not replaced behind anyone's back


def test_a_symlink_planted_as_a_page_or_a_lock_is_refused(tmp_path: Path, outside: Path) -> None:
    folder = ledger(tmp_path)
    (folder / "run-2.json").symlink_to(outside)
    with pytest.raises(StoreUnavailable, match="is a symbolic link"):
        FileStore(folder).get_sync("run-2", "e1")
    FileStore(folder)  # makes .locks
    target = tmp_path / "elsewhere" / "created-by-the-ledger"
    (folder / ".locks" / "run-3.run").symlink_to(target)
    with pytest.raises(StoreUnavailable, match="is a symbolic link"):
        FileStore(folder).create_sync("run-3", entry("e1"))
    assert not target.exists()  # O_CREAT through a link would have made it
    (folder / ".locks" / "key-1.key").symlink_to(outside)
    locks = FileLocks(folder)
    held = locks.acquire_sync("key-1", Holder("run-3", "e1", "2026-11-30T10:00:00.000Z"))
    assert held is not None  # the planted name stands as held: never read through
    assert outside.read_text() == "what the attacker wants destroyed\n"


def test_a_fifo_planted_as_a_journal_is_refused_rather_than_waited_on(tmp_path: Path) -> None:
    folder = ledger(tmp_path)
    store = FileStore(folder)
    store.create_sync("run-1", entry("e1"))
    (folder / "run-1.journal").unlink(missing_ok=True)
    os.mkfifo(folder / "run-1.journal")
    failures: list[BaseException] = []

    def read() -> None:
        try:
            FileStore(folder).get_sync("run-1", "e1")
        except BaseException as exc:  # what the reader met
            failures.append(exc)
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the ledger waited on a FIFO"
    assert failures and "is not a regular file" in str(failures[0])


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o757, 0o703])
def test_a_ledger_folder_other_users_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    folder = ledger(tmp_path)
    os.chmod(folder, mode)
    with pytest.raises(LedgerDirError, match=r"writable by its group or by others .*chmod go-w"):
        FileStore(folder)
    with pytest.raises(LedgerDirError, match="writable by its group or by others"):
        FileLocks(folder)
    os.chmod(folder, 0o755)
    os.chmod(FileStore(folder).root / ".locks", mode)
    with pytest.raises(LedgerDirError, match=r"\.locks is writable"):
        FileStore(folder)


def test_a_folder_writable_by_another_group_is_refused_and_by_this_users_own_group_is_not(
        tmp_path: Path) -> None:
    from unwind.ledger.ledger_dir import _group_is_mine

    folder = ledger(tmp_path)
    os.chmod(folder, 0o775)  # a umask of 002, as with user private groups
    if _group_is_mine(os.getegid()):
        FileStore(folder)  # a group of one: no one else writes it
    if os.geteuid() != 0:
        print("skipping the other group: handing a folder to another group needs root")
        return
    os.chown(folder, -1, 65534)
    with pytest.raises(LedgerDirError, match="writable by its group or by others"):
        FileStore(folder)


def test_a_locks_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    folder = ledger(tmp_path)
    (tmp_path / "other-locks").mkdir()
    (folder / ".locks").symlink_to(tmp_path / "other-locks")
    with pytest.raises(LedgerDirError, match="is not a folder"):
        FileStore(folder)


def test_a_ledger_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        print("skipping: handing a folder to another user needs root")
        pytest.skip("handing a folder to another user needs root")
    folder = ledger(tmp_path)
    os.chown(folder, 65534, 65534)
    with pytest.raises(LedgerDirError, match=r"belongs to uid 65534, not to this user"):
        FileStore(folder)


def test_the_gateway_refuses_to_start_on_a_ledger_folder_others_can_write(tmp_path: Path) -> None:
    folder = ledger(tmp_path)
    os.chmod(folder, 0o777)
    (tmp_path / "m.yaml").write_text("tool: a.read\neffect: read_only\npermission: a:read\n")
    done = subprocess.run([sys.executable, "-m", "unwind.cli.main", "gateway", "--manifests",
                           str(tmp_path / "m.yaml"), "--ledger-dir", str(folder), "--listen",
                           "127.0.0.1:1"], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"})
    assert done.returncode == 1
    assert "is writable by its group or by others (mode 777)" in done.stderr
