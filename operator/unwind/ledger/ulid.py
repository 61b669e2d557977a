"""ULIDs: 48 bits of milliseconds then 80 random bits, in Crockford's base32 (26 chars).

The entry id when a caller sends no Idempotency-Key: unique, and sorted by time, so the
entries of a run read in order even by id. Twelve lines do not need a dependency.
"""

from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_ulid(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    return "".join(_ALPHABET[(value >> shift) & 31] for shift in range(125, -1, -5))
