"""``python -m tests.sim``: search seeds, or replay one.

    python -m tests.sim --find --seeds 1000        # first seed per invariant and known bug
    python -m tests.sim --seeds 100000 --start 5000 # a longer search, from seed 5000
    python -m tests.sim --seed 37                  # replay seed 37: its trace and breaches
    UNWIND_SIM_SEED=37 python -m tests.sim         # the same

Run from the repository root with the project's venv (``PYTHONPATH=operator:.``, as
DEVELOPMENT.md says). Exit 1 when any seed breaks an invariant.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from .check import KNOWN
from .run import Result, run


def report(result: Result) -> str:
    lines = [f"seed {result.seed} ({result.kind} store), {len(result.trace)} trace lines:",
             *result.trace, f"seed {result.seed} breaks:"]
    for b in result.breaches:
        bug = f"known bug ({b['bug']})" if b["bug"] in KNOWN else "no known bug"
        lines.append(f"  {b['invariant']} at {b['at']:.3f} [{bug}]: {b['message']}")
    if not result.scripted:
        lines.append(f"replay: UNWIND_SIM_SEED={result.seed} python -m tests.sim")
    return "\n".join(lines)


def find(start: int, count: int, quiet: bool) -> int:
    first: dict[tuple[str, str], int] = {}
    hits: dict[tuple[str, str], int] = {}
    failed = 0
    began = time.perf_counter()
    for seed in range(start, start + count):
        result = run(seed)
        failed += not result.ok
        for b in result.breaches:
            key = (b["invariant"], b["bug"])
            hits[key] = hits.get(key, 0) + 1
            if key not in first:
                first[key] = seed
                if not quiet:
                    print(f"seed {seed}: {b['invariant']} [{b['bug']}]: {b['message'][:300]}",
                          flush=True)
    took = time.perf_counter() - began
    print(f"\n{count} seeds from {start} in {took:.1f} s ({took / count * 1000:.0f} ms a seed): "
          f"{failed} broke an invariant")
    for bug, title in KNOWN.items():
        seeds = [s for (_, b), s in first.items() if b == bug]
        found = f"first at seed {min(seeds)} ({min(seeds) - start + 1} seeds)" if seeds else "not found"
        print(f"  known bug ({bug}) {title}: {found}")
    for (invariant, bug), seed in sorted(first.items()):
        print(f"  {invariant:<17} [{bug:>5}] first at seed {seed}, in {hits[(invariant, bug)]} seeds")
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.sim", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, help="replay this seed (also UNWIND_SIM_SEED)")
    parser.add_argument("--find", action="store_true", help="search seeds, report the first per "
                        "invariant and known bug")
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds (default 1000)")
    parser.add_argument("--start", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--quiet", action="store_true", help="only the summary")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else os.environ.get("UNWIND_SIM_SEED")
    if seed is not None and not args.find:
        result = run(int(seed))
        print(report(result) if not result.ok else "\n".join([*result.trace, f"seed {seed}: ok"]))
        return 0 if result.ok else 1
    return find(args.start, args.seeds, args.quiet)


if __name__ == "__main__":
    sys.exit(main())
