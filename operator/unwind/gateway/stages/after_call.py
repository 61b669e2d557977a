"""After the call: the read that ``compensation.verification.after_call`` asks for, made
right after a call succeeded and kept in its entry by a second compare-and-set
(``succeeded`` to ``succeeded``), so the divergence check before an undo compares like with
like (gateway/after_read.py holds the read and the write; this stage runs them and says in
the report when the read could not be recorded).
"""

from __future__ import annotations

from typing import Any

from ...ledger.entry import Entry, Handle
from ...upstream.errors import Refusal
from ..after_read import read_after, record_after
from ..callstate import Call as _Call
from .base import Stage


class AfterCall(Stage):
    async def _read_after(self, c: _Call, entry: Entry, handle: Handle, data: Any,
                          report: dict[str, Any]) -> None:
        """verification.after_call: the read the divergence check compares with (after_read.py)."""
        assert c.m is not None
        after, why = await read_after(self.catalogue, self.upstream, self.secrets, c.m,
                                      c.req.arguments, data, c.before)
        if after is not None:
            try:
                why = await self.ledger(record_after(self.store, c.req.run, entry, handle, after))
            except Refusal as exc:
                why = exc.message
        if why is not None:
            report["warnings"].append(f"the read after the call was not recorded ({why}): its "
                                      "undo will have no divergence check")
