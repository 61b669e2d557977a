"""Benchmark: `unwind validate` over N generated manifests, set level included.

    python -m benchmarks.manifest -n 1000

Writes N manifests (a third compensable with a refund and a read-back, a third idempotent
undo tools, a third reads) as YAML files in a temporary folder, then times, in the same
run: the baseline (reading and parsing the same files with PyYAML, nothing else) and the
full check (read, parse, validate each manifest, validate the set). Best of --repeat runs.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from unwind.manifest.loader import check_paths, expand_paths

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def generate(folder: Path, n: int, per_file: int = 50) -> None:
    docs: list[dict[str, Any]] = []
    for i in range((n + 2) // 3):
        docs.append({"tool": f"svc{i}.get", "effect": "read_only", "permission": f"svc{i}:read",
                     "description": "Read one thing.", "timeout_ms": "5s"})
        docs.append({"tool": f"svc{i}.undo", "effect": "idempotent", "permission": f"svc{i}:write",
                     "owner": ["team"], "retry": {"attempts": 3, "base_ms": "200ms"}})
        docs.append({
            "tool": f"svc{i}.create", "effect": "compensable", "permission": f"svc{i}:write",
            "description": "Create one thing.", "owner": ["team"], "timeout_ms": "30s",
            "idempotency": {"key": f"create-{i}-{{{{args.id}}}}", "scope": "global"},
            "approval": {"roles": ["finance"], "quorum": 2, "timeout": "15m"},
            "requires": [f"svc{i}.get"],
            "compensation": {
                "tool": f"svc{i}.undo", "residue": ["a trace"],
                "argument_map": {"id": "$result.id", "amount": "$args.amount?"},
                "verification": {"tool": f"svc{i}.get", "arguments": {"id": "$result.id"},
                                 "expect": {"state": "undone"}}}})
    docs = docs[:n]
    for f, start in enumerate(range(0, len(docs), per_file)):
        (folder / f"m{f:04d}.yaml").write_text(yaml.safe_dump(docs[start:start + per_file], sort_keys=False))


def best_of(repeat: int, fn: Callable[[], None]) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("-n", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        generate(folder, args.n)

        def parse_only() -> None:
            files, _ = expand_paths([folder])
            for path in files:
                list(yaml.load_all(path.read_text(), Loader=_Loader))

        def full() -> None:
            result = check_paths([folder])
            assert result.ok and len(result.manifests) == args.n, result.issues[:3]

        baseline = best_of(args.repeat, parse_only)
        checked = best_of(args.repeat, full)
    print(f"{'what':<44}{'seconds':>10}{'per manifest':>16}")
    print(f"{'baseline: read + parse YAML only':<44}{baseline:>10.3f}{baseline / args.n * 1e6:>13.0f} us")
    print(f"{'unwind validate (parse + single + set)':<44}{checked:>10.3f}{checked / args.n * 1e6:>13.0f} us")
    print(f"validation on top of parsing: {checked - baseline:.3f} s for {args.n} manifests "
          f"(target: whole validate <= 1 s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
