"""Durations: a number of milliseconds, or a string with a unit (500ms, 30s, 15m, 2h, 1d).

Every duration field normalizes to integer milliseconds so that two manifests that
mean the same thing serialize (and checksum) the same. A manifest's durations are
timeouts, backoffs and undo deadlines: one longer than a year is a slip (a unit or a zero
too many), and past 2^53 ms it would not even survive a JSON round trip, so the manifest
fields refuse it (``parse_manifest_duration``).
"""

from __future__ import annotations

import re
from typing import Any

_UNIT_MS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d)\s*$")


def parse_duration(value: Any) -> int:
    """Return milliseconds for ``value`` or raise ValueError with a sentence to act on."""
    if isinstance(value, bool):
        raise ValueError("must be a duration such as 500ms, 30s, 15m, 2h or 1d, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        match = _DURATION.match(text)
        if match:
            return int(match.group(1)) * _UNIT_MS[match.group(2)]
    raise ValueError(
        f"{value!r} is not a duration: write milliseconds (1500) or a number with a unit "
        "(500ms, 30s, 15m, 2h, 1d)"
    )


MAX_MANIFEST_MS = 366 * _UNIT_MS["d"]


def parse_manifest_duration(value: Any) -> int:
    """``parse_duration`` for a manifest field: also refuses anything longer than 366 days."""
    ms = parse_duration(value)
    if ms > MAX_MANIFEST_MS:
        shown = value if isinstance(value, str) else f"{value} ms"
        raise ValueError(f"{shown!r} is longer than a year (366d, {MAX_MANIFEST_MS} ms), the "
                         "longest a timeout or deadline may be: check the unit or the number of "
                         "zeros")
    return ms
