"""The effect ledger: entries, handles resolved from argument maps, and the undo planner.

Pure domain code: imports neither kopf nor the Kubernetes client. So far it holds the
approval tally (``approvals``), which decides whether a call that needs a human was
approved, denied, or is still waiting.
"""
