"""The capture: a manifest's read-only ``capture`` call reads the state the call changes,
after the key is taken and before the write-ahead.
"""

from __future__ import annotations

from ...ledger.handle import missing_captured, secret_texts
from ...manifest.model import Effect
from ...manifest.refs import resolve_map
from ...upstream.client import prepare
from ...upstream.errors import Refusal
from ..callstate import Call as _Call
from .base import Stage


class Capture(Stage):
    async def _capture(self, c: _Call) -> None:
        """The manifest's ``capture``: read the state the call changes, after the key is
        taken and before the write-ahead, so the pending entry holds it. A capture that
        cannot be read (its tool not served or not read_only, not sent, a timeout, an answer
        that is not 2xx JSON, or one without a ``$before`` path the undo needs) refuses the
        call: 502 upstream_error, and nothing reaches the call's upstream. A staged call
        makes a draft, whose undo is its discard: it captures nothing."""
        m = c.m
        assert m is not None
        cap = m.capture
        if cap is None or c.req.stage:
            return

        def failed(why: str) -> Refusal:
            return Refusal("upstream_error", f"the capture {cap.tool} of {m.tool} {why}, so "
                           f"nothing was sent to {m.tool}'s upstream (the undo would have "
                           "nothing to restore): try again once the capture answers",
                           {"capture": cap.tool})
        served = self.catalogue.get(cap.tool)
        if served is None or not served.manifest.enforceable:
            raise failed("is not served here")
        if served.manifest.effect != Effect.read_only:
            raise failed(f"is {served.manifest.effect}, not read_only")
        args, missing = resolve_map(cap.arguments, c.req.arguments, None)
        if missing:
            raise Refusal("validation_error", f"the capture {cap.tool} of {m.tool} cannot be "
                          "filled from the call's arguments: " + "; ".join(missing))
        try:
            prepared = prepare(served.manifest, args, self.secrets, {})
        except Refusal as exc:
            raise failed(f"could not be sent ({exc.message})") from None
        answer = await self.upstream.send(prepared)
        if answer.kind != "ok":
            why = {"error_status": f"answered {answer.status}",
                   "timeout": "timed out",
                   "not_json": f"answered {answer.status} with a body that is not JSON"}.get(
                       answer.kind, f"failed ({answer.text or answer.kind})")
            raise failed(why)
        before = answer.data if answer.data is not None else {}
        gaps = missing_captured(m, before)
        if gaps:
            raise failed("answered without a value the undo needs: " + "; ".join(gaps))
        c.before = before
        c.secrets = secret_texts(m, c.req.arguments, None, before)
