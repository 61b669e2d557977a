"""What a call is and what it has established so far: shared by the enforcement path
(``enforce.py``) and the stages split out of it (``keylocks.py``, ``runlimit.py``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

from ..ledger.entry import Entry
from ..manifest.canonical import canonical_json
from ..manifest.model import ToolManifest
from ..upstream.client import McpContent

if TYPE_CHECKING:
    from .plan import CallPlan


@dataclass(frozen=True)
class CallRequest:
    tool: str
    arguments: dict[str, Any]
    run: str
    entry_id: str
    stage: bool = False
    dry_run: bool = False


@dataclass
class CallResult:
    status: int
    body: Any
    report: dict[str, Any] | None = None
    entry: str | None = None
    content: McpContent | None = None  # an MCP upstream's result as sent (mcp_server.py)


@dataclass(frozen=True)
class Settings:
    scopes: frozenset[str]
    actor: str
    identities: Literal["kubernetes", "self-declared"] = "self-declared"
    # How long writing an entry ahead may take: a key lock stands at least this long past
    # the capture's and the call's own time even if its entry is never found (its writer is
    # between taking the lock and writing ahead; only a crash leaves one longer). It is
    # also the grace of an older lock that records no deadline.
    lock_grace: timedelta = timedelta(seconds=30)
    # Added to every call's deadline: the clocks of the gateway and of a rollback differ a
    # little, and a loaded process answers late.
    deadline_margin: timedelta = timedelta(seconds=5)
    # What one agent may create (docs/gateway.md, "Limits"): distinct runs this gateway
    # writes per window, and entries per run. None or 0: no limit.
    max_runs: int | None = 1000
    runs_window: timedelta = timedelta(hours=1)
    max_entries: int | None = 10_000


@dataclass
class Call:
    """What one call has established so far (for its report and its refusal record)."""

    req: CallRequest
    m: ToolManifest | None = None
    checksum: str | None = None
    version: int | None = None
    key: str | None = None
    key_sent: str | None = None
    secrets: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    existing: Entry | None = None
    record: bool = True  # whether a refusal is recorded as an entry
    before: Any = None  # the capture's answer (None: no capture ran)
    fresh: bool = False  # read the Idempotency-Key's entry, never answer it from a cache
    probed: bool = False  # "no such entry" came from the store's copy of the run (probe)
    deadline: datetime | None = None  # when its upstream call is over (set at the write-ahead)
    plan: CallPlan | None = None  # the tool's call plan (plan.py), once the tool is known

    def digest(self) -> str:
        return "sha256:" + hashlib.sha256(canonical_json(self.req.arguments)).hexdigest()
