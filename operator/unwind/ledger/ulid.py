"""ULIDs: 48 bits of milliseconds then 80 random bits, in Crockford's base32 (26 chars).

The entry id when a caller sends no Idempotency-Key: unique, and sorted by time, so the
entries of a run read in order even by id. Twelve lines do not need a dependency.
"""

from __future__ import annotations

import base64
import secrets
import time

_ALPHABET = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"
# base64's base32 digits (RFC 4648) -> Crockford's
_CROCKFORD = bytes.maketrans(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", _ALPHABET.encode())


def new_ulid(now_ms: int | None = None) -> str:
    ms = int(time.time() * 1000) if now_ms is None else now_ms
    value = (ms & ((1 << 48) - 1)) << 80 | secrets.randbits(80)
    # 20 bytes make 32 base32 digits, the last 26 of which hold the 128 bits (a digit at a
    # time in Python cost more than the rest of the id)
    return base64.b32encode(value.to_bytes(20, "big"))[6:].translate(_CROCKFORD).decode()
