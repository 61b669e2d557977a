"""Benchmark: what signing and verifying registry versions costs.

    python -m benchmarks.registry [-n 1000]

Signs and verifies N version messages with Ed25519, and, as a baseline measured in the
same run on the same machine, hashes the same messages with sha256 (the floor any
integrity check pays). It also times the full per-version check a loader runs
(``check_version``: checksum, index agreement, signature, validation), since that is what
a gateway pays once per tool on every (re)load.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from collections.abc import Callable, Sequence

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.manifest.canonical import checksum
from unwind.registry.records import VersionRecord, check_version
from unwind.registry.signing import TrustStore, sign, signing_message, verify_signature


def _time(label: str, fn: Callable[[], object]) -> tuple[str, float]:
    start = time.perf_counter()
    fn()
    return label, time.perf_counter() - start


def run(n: int) -> list[tuple[str, float]]:
    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    trust = TrustStore([public])
    manifests: list[dict[str, object]] = [{"tool": f"bench.tool_{i}", "effect": "read_only", "permission": "bench:read",
                  "version": 1, "lifecycle": "approved"} for i in range(n)]
    sums = [checksum(m) for m in manifests]
    messages = [signing_message(str(m["tool"]), 1, s) for m, s in zip(manifests, sums, strict=True)]
    signatures = [sign(key, msg) for msg in messages]  # warm-up, and the input for verify
    records = [VersionRecord(tool=str(m["tool"]), version=1, lifecycle="approved", checksum=s,
                             created="2025-01-01T00:00:00Z", by="bench", action="publish",
                             manifest=m, signature=sig).to_json()
               for m, s, sig in zip(manifests, sums, signatures, strict=True)]
    entries = [VersionRecord.from_json(r).index_entry() for r in records]

    def verify_all() -> None:
        for msg, sig in zip(messages, signatures, strict=True):
            assert verify_signature(public, msg, sig.value)

    def check_all() -> None:
        for m, entry, record in zip(manifests, entries, records, strict=True):
            manifest, problems = check_version(str(m["tool"]), entry, record, "bench", trust)
            assert manifest is not None and not problems

    return [
        _time("sha256 (baseline)", lambda: [hashlib.sha256(msg).digest() for msg in messages]),
        _time("ed25519 sign", lambda: [sign(key, msg) for msg in messages]),
        _time("ed25519 verify", verify_all),
        _time("full version check", check_all),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.registry")
    parser.add_argument("-n", type=int, default=1000, help="versions to sign and verify")
    n = parser.parse_args(argv).n
    results = run(n)
    base = results[0][1]
    print(f"{n} versions")
    print(f"{'operation':<22}{'total ms':>10}{'per op µs':>12}{'× sha256':>10}")
    for label, seconds in results:
        print(f"{label:<22}{seconds * 1e3:>10.2f}{seconds / n * 1e6:>12.2f}{seconds / base:>10.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
