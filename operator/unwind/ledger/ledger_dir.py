"""The file ledger's folder and files, opened so that nobody else can steer them (issue 29,
item 6; used by ``filestore.py``).

A symlink planted as ``<run>.journal`` made the gateway truncate a file outside the ledger
folder. Every journal, page and lock is opened with ``O_NOFOLLOW`` (and ``O_NONBLOCK``, so
a FIFO planted in its place is refused rather than waited on) and must be a regular file;
and a folder that another user can write (others, a group that is not this user's own, or
owned by someone else) is refused, since whoever writes it can plant files the gateway
reads as ledgers.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from .store import StoreUnavailable

LOCKS = ".locks"


class LedgerDirError(Exception):
    """The ledger folder cannot be used; the message says why and what to do."""


def open_file(path: str | os.PathLike[str], flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a link at ``path`` and opens only a regular file."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StoreUnavailable(f"{path} is a symbolic link: the ledger opens no link (one "
                                   "planted there sends its writes elsewhere); remove it") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreUnavailable(f"{path} is not a regular file: remove it")
    return fd


def read_file(path: str | os.PathLike[str], start: int = 0) -> tuple[bytes, os.stat_result]:
    """What a ledger file holds from ``start``, and its stat (``open_file``'s rules)."""
    fd = open_file(path, os.O_RDONLY)
    with os.fdopen(fd, "rb") as f:
        f.seek(start)
        return f.read(), os.fstat(f.fileno())


def _group_is_mine(gid: int) -> bool:
    """Whether ``gid`` is this user's private group (a umask of 002 makes folders group-
    writable; with a group of one that is no one else): this user's group, naming no
    other member, and the primary group of no other account."""
    import grp
    import pwd

    if gid != os.getegid():
        return False
    try:
        me = pwd.getpwuid(os.geteuid()).pw_name
        members = set(grp.getgrgid(gid).gr_mem)
        others = {p.pw_name for p in pwd.getpwall() if p.pw_gid == gid}
    except KeyError:
        return False
    return members <= {me} and others <= {me}


def check_private(folder: Path) -> None:
    """Refuse a ledger folder (or its ``.locks``) that another user can write: owned by
    someone else, writable by others, or by a group that is not this user's own."""
    try:
        st = os.stat(folder) if folder.name != LOCKS else os.lstat(folder)
    except OSError as exc:
        raise LedgerDirError(f"the ledger folder {folder} cannot be read ({exc.strerror or exc})") \
            from None
    if not stat.S_ISDIR(st.st_mode):
        raise LedgerDirError(f"{folder} is not a folder (a link?): the ledger keeps its files in "
                             "a folder of its own; remove it")
    if st.st_uid != os.geteuid():
        raise LedgerDirError(f"the ledger folder {folder} belongs to uid {st.st_uid}, not to this "
                             f"user (uid {os.geteuid()}): its owner can plant files the gateway "
                             "would read as ledgers; give --ledger-dir a folder of your own")
    if st.st_mode & 0o002 or (st.st_mode & 0o020 and not _group_is_mine(st.st_gid)):
        raise LedgerDirError(f"the ledger folder {folder} is writable by its group or by others "
                             f"(mode {stat.S_IMODE(st.st_mode):o}): they could plant files or links "
                             f"the gateway would read or write as ledgers; chmod go-w {folder}")
