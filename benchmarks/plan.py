"""Benchmark: plan the rollback of a ledger of 10 000 entries (target: at most 1 s).

    python -m benchmarks.plan [--entries 10000] [--repeat 5]

The ledger is synthetic but shaped like a real run: comments (an inverse with a deadline),
charges (a compensation with a read-back), issues that require a comment (ordering),
reads, failed calls, lost answers (lookups) and staged drafts, as the local gateway writes
them. Beside the plan it times the baseline every reader pays anyway: parsing the ledger's
JSON. The best of ``--repeat`` runs is reported.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import TypeAdapter

from unwind.ledger.entry import Entry, Handle, Staged, State, Times, stamp
from unwind.ledger.plan import Versions, make_plan
from unwind.manifest.canonical import checksum
from unwind.manifest.model import ToolManifest

_MANIFESTS: list[dict[str, Any]] = [
    {"tool": "comment", "effect": "reversible",
     "compensation": {"tool": "delete_comment", "kind": "inverse",
                      "argument_map": {"repo": "$args.repo", "comment_id": "$result.id"},
                      "deadline": {"within_ms": "1d"},
                      "verification": {"tool": "get_comment", "expect": {"found": False},
                                       "arguments": {"comment_id": "$result.id"}}}},
    {"tool": "charge", "effect": "compensable", "idempotency": {"key": "c-{{args.order}}"},
     "lookup": {"tool": "get_charge", "by": "idempotency_key", "arguments": {"key": "$key"}},
     "compensation": {"tool": "refund", "residue": ["stays on the statement"],
                      "argument_map": {"charge_id": "$result.id", "amount": "$args.amount"},
                      "verification": {"tool": "get_charge", "expect": {"refunded": True},
                                       "arguments": {"charge_id": "$result.id"}}}},
    {"tool": "issue", "effect": "compensable", "requires": ["comment"],
     "compensation": {"tool": "close_issue", "argument_map": {"number": "$result.number"}}},
    {"tool": "release", "effect": "irreversible",
     "draft": {"tool": "release", "handle": {"id": "$result.id"}, "promote": "publish",
               "discard": "delete_release"}},
    {"tool": "get_comment", "effect": "read_only"}, {"tool": "get_charge", "effect": "read_only"},
    {"tool": "delete_comment", "effect": "idempotent"}, {"tool": "refund", "effect": "idempotent"},
    {"tool": "close_issue", "effect": "idempotent"}, {"tool": "delete_release", "effect": "idempotent"},
    {"tool": "publish", "effect": "irreversible"},
]


def versions() -> Versions:
    ms = [ToolManifest.model_validate({"permission": "p:w", **m}) for m in _MANIFESTS]
    return Versions({checksum(m): m for m in ms}, {m.tool: m for m in ms})


def ledger(n: int, v: Versions) -> dict[str, Any]:
    """An EffectLedger object of ``n`` entries, as the file store writes it."""
    sums = {m.tool: s for s, m in v.by_checksum.items()}
    start = datetime(2026, 3, 1, tzinfo=UTC)
    entries = []
    for i in range(n):
        at = stamp(start + timedelta(milliseconds=37 * i))
        kind = i % 20
        tool, handle, staged, key = "comment", Handle(), None, None
        state: State = "succeeded"
        if kind < 6:
            handle = Handle(args={"repo": "octo/hello"}, result={"id": i})
        elif kind < 12:
            tool, key = "charge", f"c-o{i}"
            handle = Handle(args={"amount": 100 + i}, result={"id": f"ch_{i}"})
        elif kind < 14:
            tool, handle = "issue", Handle(result={"number": i})
        elif kind < 16:
            tool, handle = "get_charge", Handle()
        elif kind == 16:
            tool, state, key = "charge", "uncertain", f"c-o{i}"
        elif kind == 17:
            tool, state = "charge", "failed"
        else:
            tool = "release"
            staged = Staged(draft_tool="release", handle={"id": i}, promote="publish",
                            discard="delete_release")
        entries.append(Entry(id=f"e-{i:05d}", seq=i + 1, tool=tool, checksum=sums[tool],
                             effect=str(v.tools[tool].effect), key=key, actor="agent",
                             state=state,
                             handle=handle, staged=staged,
                             times=Times(requested=at, started=at, finished=at)).to_json())
    return {"apiVersion": "unwind.dev/v1alpha1", "kind": "EffectLedger",
            "metadata": {"name": "bench"}, "spec": {"run": "bench", "page": 1},
            "status": {"entries": entries, "entryCount": n}}


def best(repeat: int, fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    v = versions()
    text = json.dumps(ledger(args.entries, v), separators=(",", ":"))
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)

    adapter = TypeAdapter(list[Entry])

    def validated() -> list[Entry]:  # as unwind plan reads a ledger file
        return adapter.validate_python(json.loads(text)["status"]["entries"])
    entries = validated()
    parse = best(args.repeat, lambda: json.loads(text))
    read = best(args.repeat, validated)
    plan = best(args.repeat, lambda: make_plan("bench", entries, v, now=now))
    total = best(args.repeat, lambda: make_plan("bench", validated(), v, now=now))
    steps = make_plan("bench", entries, v, now=now).steps
    counts: dict[str, int] = {}
    for s in steps:
        counts[s.action] = counts.get(s.action, 0) + 1
    print(f"ledger: {args.entries} entries, {len(text) / 1e6:.1f} MB of JSON; plan: "
          + ", ".join(f"{k} {n}" for k, n in sorted(counts.items())))
    print(f"baseline: parse the ledger JSON          {parse * 1000:8.1f} ms")
    print(f"read: parse and validate the entries     {read * 1000:8.1f} ms")
    print(f"plan: from the validated entries         {plan * 1000:8.1f} ms")
    print(f"total: ledger text to plan               {total * 1000:8.1f} ms   (target <= 1000 ms)")


if __name__ == "__main__":
    main()
