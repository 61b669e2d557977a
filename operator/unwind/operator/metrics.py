"""Prometheus metrics of the operator."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

RECONCILES = Counter("unwind_reconciles_total", "Namespace reconciles, by result.", ["result"])
RECONCILE_SECONDS = Histogram("unwind_reconcile_seconds", "Time to gather, plan and write one namespace.")
BUNDLE_WRITES = Counter("unwind_bundle_writes_total", "Bundle ConfigMap writes.", ["namespace"])
BUNDLE_LATENCY = Histogram(
    "unwind_bundle_publish_latency_seconds",
    "From the first change seen to the bundle written.",
    buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
STATUS_PATCHES = Counter("unwind_status_patches_total", "ToolManifest status patches.")
LEDGERS_CHECKED = Counter("unwind_ledgers_checked_total",
                          "EffectLedgers the rollback loop decided on (rollbacks, lost answers, retention).",
                          ["namespace"])
