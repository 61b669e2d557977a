"""Running undo plans: one step (``runner``, the Job's ``unwind undo-step``), a whole local
rollback over a ledger file (``local``), and signed evidence of a run (``evidence``).

The deciding is done in ``unwind.ledger.plan`` (pure); this package makes the calls and
writes the outcomes.
"""
