"""Approval: a call that needs a human waits as an ``awaiting_approval`` entry, which holds
its key.
"""

from __future__ import annotations

from ...ledger import decide
from ...ledger.approvals import ApprovalRules
from ...upstream.errors import Refusal
from ..callstate import Call as _Call
from ..callstate import CallResult
from .base import Stage


class Approval(Stage):
    async def _await_approval(self, c: _Call, rules: ApprovalRules) -> CallResult:
        """The call waits for a human as an ``awaiting_approval`` entry, which holds its key:
        the lock is taken first (a duplicate is refused at once, no human asked), and given
        back if the entry cannot be stored."""
        entry = self._entry(c, "awaiting_approval",
                            approval=decide.record(rules, self.settings.identities))
        entry = decide.settle(c.req.run, entry, self.clock())
        holder = await self._take_key(c, None)
        try:
            stored = await self._store_new(c, entry, reread=True)
        except BaseException:
            await self._release(c, holder)
            raise
        c.record = False
        assert stored.approval is not None
        refusal = Refusal("approval_required", f"{stored.tool} needs approval: "
                          f"{stored.approval.message}; repeat the call with Idempotency-Key "
                          f"{stored.id} once it is approved", {"entry": stored.id})
        return self._answer_refusal(c, refusal)
