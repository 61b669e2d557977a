"""The idempotency key: rendered from the call's arguments (its template parsed once, keys.py;
its carrier in the call plan), carried to the upstream (argument or header), and the caller's
Idempotency-Key (the entry id) checked free. The key's lock is keylocks.py.
"""

from __future__ import annotations

from typing import Any

from ...ledger import decide
from ...ledger.lifecycle import REUSABLE
from ...ledger.store import probe
from ...manifest.keys import KeyRenderError, render_key, sent_key
from ...upstream.errors import Refusal
from ..callstate import Call as _Call
from .base import Stage


class Key(Stage):
    def _render_key(self, c: _Call, args: dict[str, Any]) -> None:
        m = c.m
        assert m is not None
        if m.idempotency is None:
            return
        try:
            c.key = render_key(m.idempotency.key, c.req.arguments)
        except KeyRenderError as exc:
            raise Refusal("validation_error", exc.reason) from None
        carrier = m.idempotency.carrier
        if carrier is None:
            return
        c.key_sent = sent_key(m, c.req.run, c.key)  # scope run, header: the run is in it
        if carrier.argument is not None:
            given = args.get(carrier.argument)
            if given is not None and given != c.key_sent:
                raise Refusal("validation_error", f"argument {carrier.argument} carries the "
                              "idempotency key, and the call gives a different one: leave it "
                              "out (the gateway fills it in) or make it match")
            args[carrier.argument] = c.key_sent

    def _key_headers(self, c: _Call) -> dict[str, str]:
        m = c.m
        carrier = m.idempotency.carrier if m and m.idempotency else None
        if carrier is None or carrier.header is None or c.key_sent is None or c.req.stage:
            return {}
        return {carrier.header: c.key_sent}

    async def _idempotency_key_is_free(self, c: _Call) -> None:
        """The caller's Idempotency-Key (the entry id): unused, or naming an entry that may
        run again: failed, refused, or awaiting approval (then tallied here)."""
        req = c.req
        if c.fresh:
            existing = await self.ledger(self.store.get(req.run, req.entry_id))
        else:
            existing = await self.ledger(probe(self.store, req.run, req.entry_id))
            c.probed = existing is None
        if existing is None or existing.state in REUSABLE:
            c.existing = existing
            return
        same = existing.arguments_sha256 == c.digest() and existing.tool == req.tool
        if existing.state in ("awaiting_approval", "denied") and same:
            c.record = False  # the entry itself records the approval's course
            settled = decide.settle(req.run, existing, self.clock())
            if settled.state != existing.state:
                settled = await self.ledger(self.store.transition(
                    req.run, existing.id, decide.settling(req.run, self.clock())))
            if settled.state == "denied":
                message = settled.approval.message if settled.approval else "denied"
                raise Refusal("denied", f"entry {existing.id} was denied: {message}",
                              {"entry": existing.id})
            if settled.approval is not None and settled.approval.state == "awaiting_approval":
                raise Refusal("approval_required", f"entry {existing.id} awaits approval: "
                              f"{settled.approval.message}", {"entry": existing.id})
            c.existing = settled
            return
        why = ("with other arguments" if not same else f"and is {existing.state}")
        raise Refusal("duplicate", f"Idempotency-Key {existing.id} names an entry of run "
                      f"{req.run} already ({existing.tool}, {why}): a call runs once; use a new "
                      "key for a new call", {"entry": existing.id})
