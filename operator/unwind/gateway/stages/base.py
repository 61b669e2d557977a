"""What every stage of the call path shares: the gateway's services and settings, and the
ledger's answers turned into refusals (``ledger``). Each stage is a mixin of ``Gateway``
(enforce.py composes them); a method one stage takes from another is declared here."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from ...ledger.entry import Entry, Handle
from ...ledger.fence import Fenced
from ...ledger.store import (
    EntryExists,
    EntryMissing,
    Locks,
    NotOwner,
    RunFull,
    Stale,
    Store,
    StoreUnavailable,
)
from ...upstream.client import Upstream
from ...upstream.errors import Refusal
from ...upstream.secrets import Secrets
from ..callstate import Call as _Call
from ..callstate import CallResult, Settings
from ..catalogue import Catalogue
from ..keylocks import KeyHolding
from ..metrics import Metrics
from ..runlimit import RunLimit

log = logging.getLogger("unwind.gateway")
T = TypeVar("T")


class Stage(KeyHolding):
    catalogue: Catalogue
    store: Store
    locks: Locks
    upstream: Upstream
    secrets: Secrets
    settings: Settings
    metrics: Metrics
    clock: Callable[[], datetime]
    runs: RunLimit
    _own_runs: set[str]

    # ---- what one stage takes from another (the composition, enforce.py, has them all) ----

    def _not_ours(self, run: str, owner: str) -> Refusal:
        raise NotImplementedError

    def _new_id(self) -> str:
        raise NotImplementedError

    async def _room_for_run(self, c: _Call) -> bool:
        raise NotImplementedError

    def _entry(self, c: _Call, state: Any, **fields: Any) -> Entry:
        raise NotImplementedError

    async def _store_new(self, c: _Call, entry: Entry, *, reread: bool = False) -> Entry:
        raise NotImplementedError

    def _answer_refusal(self, c: _Call, refusal: Refusal) -> CallResult:
        raise NotImplementedError

    async def _read_after(self, c: _Call, entry: Entry, handle: Handle, data: Any,
                          report: dict[str, Any]) -> None:
        raise NotImplementedError

    # ---- the ledger ----

    async def ledger(self, op: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await op
        except (EntryExists, EntryMissing, Stale, NotOwner, RunFull, Fenced):
            raise  # answers of the store protocol, for the caller to handle
        except Exception as exc:  # StoreUnavailable, or a store that broke in another way
            self.metrics.ledger_failures.inc()
            if not isinstance(exc, StoreUnavailable):
                log.exception("the ledger store failed")
            raise Refusal("ledger_unavailable", f"the ledger cannot be written, so nothing is "
                          f"called: {exc}") from None
        finally:
            self.metrics.ledger_writes.observe(time.perf_counter() - started)

