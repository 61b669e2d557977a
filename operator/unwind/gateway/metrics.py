"""Prometheus metrics of one gateway process, in their own registry (served at /metrics).

Tool names are labels only for tools the catalogue serves: an unknown name from a caller
is counted as ``(unknown)``, so nobody can grow the label set by calling made-up tools.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

UNKNOWN_TOOL = "(unknown)"
_LATENCY = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter("unwind_gateway_calls", "Calls by tool, effect class and outcome "
                             "(the entry's state, or the refusal code).",
                             ["tool", "effect_class", "outcome"], registry=self.registry)
        self.latency = Histogram("unwind_gateway_call_seconds", "Time to answer a call, by tool.",
                                 ["tool"], buckets=_LATENCY, registry=self.registry)
        self._calls: dict[tuple[str, str, str], Counter] = {}  # their series, by labels
        self._latency: dict[str, Histogram] = {}
        self.ledger_writes = Histogram("unwind_gateway_ledger_write_seconds",
                                       "Time to store one ledger write.", buckets=_LATENCY,
                                       registry=self.registry)
        self.ledger_failures = Counter("unwind_gateway_ledger_failures",
                                       "Ledger writes that failed (the call got 503).",
                                       registry=self.registry)
        self.catalogue = Gauge("unwind_gateway_catalogue_info", "The catalogue (bundle) served: "
                               "1 for its generation.", ["generation"], registry=self.registry)
        self.catalogue_refusals = Counter(
            "unwind_gateway_catalogue_refusals", "Bundles refused, by code (bad_signature, "
            "rollback, shard_mismatch, ...; unreachable: the API server could not be read); the "
            "previous bundle keeps serving.", ["code"], registry=self.registry)
        # In a pod: what the gateway sends the API server (set from the client and the store).
        self.api_bytes = Gauge("unwind_gateway_api_request_bytes", "Bytes of request bodies "
                               "sent to the API server since start (ledger pages, Leases).",
                               registry=self.registry)
        self.ledger_api_writes = Gauge("unwind_gateway_ledger_api_writes", "EffectLedger writes "
                                       "(creates and status updates) since start.",
                                       registry=self.registry)
        # On a laptop: the file ledger's fsyncs (the calls that arrive together share one).
        self.ledger_fsyncs = Gauge("unwind_gateway_ledger_fsyncs", "fsync calls of the file "
                                   "ledger since start (pages, journals, the folder).",
                                   registry=self.registry)
        self.observed = Counter("unwind_gateway_observed_violations", "Violations recorded but not "
                                "refused (observe mode), by tool and code.", ["tool", "code"],
                                registry=self.registry)
        self.ready = Gauge("unwind_gateway_catalogue_ready", "1 when a valid catalogue is served.",
                           registry=self.registry)

    def called(self, tool: str, effect_class: str, outcome: str, seconds: float) -> None:
        """Count one answered call and its time. The labelled series are looked up once
        (``labels`` costs more than the count itself)."""
        count = self._calls.get((tool, effect_class, outcome))
        if count is None:
            count = self._calls[(tool, effect_class, outcome)] = self.calls.labels(
                tool, effect_class, outcome)
        count.inc()
        timing = self._latency.get(tool)
        if timing is None:
            timing = self._latency[tool] = self.latency.labels(tool)
        timing.observe(seconds)

    def serving(self, generation: str, ready: bool) -> None:
        self.catalogue.clear()
        self.catalogue.labels(generation=generation).set(1)
        self.ready.set(1 if ready else 0)
