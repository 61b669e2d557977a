"""Whose runs a gateway writes, and how many: the first stage of every call (after the doors' own
authentication and rate limits). A gateway writes only runs its actor owns; at most
``max_runs`` distinct runs per window (runlimit.py). An authenticated door hands each caller
a view of the gateway acting as that caller (``acting_as``): its own actor, scopes and the
runs it remembers as its own; the services and the call plans are shared.
"""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Self

from ...ledger.entry import Entry
from ...upstream.errors import Refusal
from ..callstate import Call as _Call
from ..runlimit import RunLimit
from .base import Stage


class Ownership(Stage):
    def acting_as(self, actor: str, scopes: frozenset[str]) -> Self:
        """This gateway for one authenticated caller (gateway/auth): everything shared but
        the actor, its scopes, and what the gateway remembers per actor."""
        view = copy.copy(self)
        view.settings = replace(self.settings, actor=actor, scopes=scopes)
        view._own_runs = set()
        view.runs = RunLimit(self.settings.max_runs, self.settings.runs_window, self.clock)
        return view

    async def _run_is_ours(self, c: _Call) -> None:
        """A gateway writes only runs its actor owns: an agent must not hide its calls in
        another agent's run (whose rollback would then undo them while its own missed
        them), nor write refusals there. This read answers early and clearly; what decides
        is the store, which checks the owner in the same locked (or conditional) write as
        each entry. Only an owner recorded as this actor is remembered: a run with no
        ledger yet (a dry run's, say) belongs to whoever writes it first."""
        run = c.req.run
        if run in self._own_runs:
            return
        owner = await self.ledger(self.store.owner(run))
        if owner is not None and owner != self.settings.actor:
            c.record = False
            raise self._not_ours(run, owner)
        if owner is not None:
            self._own_runs.add(run)

    def _not_ours(self, run: str, owner: str) -> Refusal:
        return Refusal("permission_denied", f"run {run} is recorded as {owner}'s and this gateway "
                       f"acts as {self.settings.actor}: a gateway writes (and reads) only its own "
                       "runs; send another X-Unwind-Run")

    async def _room_for_run(self, c: _Call) -> bool:
        """At most ``max_runs`` distinct runs written per window by this gateway: 2000 run
        names must not make 2000 ledgers (runlimit.py). True: this call reserved the run,
        and gives it back if its create fails."""
        run = c.req.run
        if self.runs.known(run):
            return False
        counted = getattr(self.store, "runs_created", None)
        await self.runs.seed(None if counted is None else
                             lambda since: counted(self.settings.actor, since))
        if self.runs.known(run):
            return False
        why = self.runs.reserve(run)
        if why is not None:
            c.record = False
            raise Refusal("rate_limited", why)
        return True

    async def read_entry(self, run: str, entry_id: str) -> Entry | None:
        """``GET /calls/<run>/<entry>``: the same ownership rule as writes, so one agent's
        gateway never shows another's calls (their arguments' handles and answers)."""
        owner = await self.ledger(self.store.owner(run))
        if owner is not None and owner != self.settings.actor:
            raise self._not_ours(run, owner)
        entry = await self.ledger(self.store.get(run, entry_id))
        if entry is not None and entry.actor != self.settings.actor:
            raise self._not_ours(run, entry.actor)
        return entry
