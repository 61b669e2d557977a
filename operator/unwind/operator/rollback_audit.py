"""The audit trail of a run's rollbacks (pure): every request, kept after the next replaces it.

``status.rollback`` holds the request being run, with its whole frozen plan; a new request
replaces it. Before this, the first request of an incident ("the agent went rogue", and who
asked) survived only in Events, which expire. So the first page also keeps
``status.rollbacks``: one record per request (its generation), oldest first, with who asked,
when, why, when it was planned and finished, how it ended (the ``RolledBack`` reason then)
and each step as it ended (entry, action, state, outcome).

Bounded, because the first page also holds entries and the frozen plan: at most
``MAX_RECORDS`` requests and ``MAX_BYTES`` of JSON, each with at most ``MAX_STEPS`` steps
(more are counted in ``moreSteps``). Past the bound the oldest records go first and
``status.rollbacksDropped`` counts them, so the evidence says what is no longer there; the
signed evidence (``unwind ledger export``) exported before keeps them for good.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

MAX_RECORDS = 20
MAX_BYTES = 64 * 1024
MAX_STEPS = 200
_STEP_FIELDS = ("index", "entry", "action", "undo_tool", "state", "outcome")


def seen_record(generation: int, request: Mapping[str, Any], requester: Mapping[str, Any] | None,
                now: str) -> dict[str, Any]:
    """A request the operator saw and has not planned yet (it waits for calls in flight)."""
    out: dict[str, Any] = {"generation": generation, "request": dict(request), "seen": now}
    if requester:
        out["requestedBy"] = dict(requester)
    return out


def from_rollback(rb: Mapping[str, Any], result: Mapping[str, Any] | None,
                  now: str) -> dict[str, Any]:
    """The record of the request ``rb`` (a frozen ``status.rollback``); ``result``: the
    ``RolledBack`` condition once the request finished (its reason and message)."""
    steps = list(rb.get("steps") or [])
    out: dict[str, Any] = {"generation": int(rb["generation"]), "request": dict(rb.get("request") or {}),
                           "seen": now, "planned": rb.get("planned")}
    if rb.get("requestedBy"):
        out["requestedBy"] = dict(rb["requestedBy"])
    if rb.get("finished"):
        out["finished"] = rb["finished"]
        if result is not None:
            out["result"], out["message"] = result.get("reason"), str(result.get("message") or "")[:1024]
    if rb.get("error"):
        out["result"], out["message"] = rb.get("reason"), str(rb["error"])[:1024]
    out["steps"] = [{k: s[k] for k in _STEP_FIELDS if s.get(k) is not None} for s in steps[:MAX_STEPS]]
    if len(steps) > MAX_STEPS:
        out["moreSteps"] = len(steps) - MAX_STEPS
    if out.get("planned") is None:
        out.pop("planned")
    return out


def upsert(history: Sequence[Mapping[str, Any]], record: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``history`` with ``record`` in place of the record of its generation (keeping when it
    was first seen), or added at the end."""
    out = [dict(r) for r in history]
    for i, r in enumerate(out):
        if r.get("generation") == record["generation"]:
            out[i] = {**dict(record), "seen": r.get("seen") or record["seen"]}
            return out
    out.append(dict(record))
    return out


def bounded(history: Sequence[dict[str, Any]], dropped: int) -> tuple[list[dict[str, Any]], int]:
    """The history within its bound (see the module docstring), and how many were dropped."""
    out = list(history)
    while len(out) > MAX_RECORDS or (len(out) > 1 and _size(out) > MAX_BYTES):
        out.pop(0)
        dropped += 1
    return out, dropped


def _size(history: Sequence[Any]) -> int:
    return len(json.dumps(history, separators=(",", ":")).encode())
