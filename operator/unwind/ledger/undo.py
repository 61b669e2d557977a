"""What a call leaves to undo: the plan, the undo arguments and the read-back check.

Shared by the contract tests (``unwind test``, fake calls) and the gateway (real calls), so
both answer "how is this undone?" with the same code: a manifest author's contract test
and the ledger entry of a real call cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from ..manifest.model import Absent, Effect, ToolManifest
from ..manifest.refs import answer_path, resolve_map

Plan = Literal["compensate", "skip", "unrecoverable"]


def plan_call(m: ToolManifest, args: Any, result: Any, key: str | None = None, *,
              before: Any = None) -> tuple[Plan, dict[str, Any] | None, str | None]:
    """(plan, undo arguments for a compensate plan, why there is nothing to undo)."""
    if m.effect in (Effect.read_only, Effect.idempotent):
        return "skip", None, f"{m.tool} is {m.effect}: a rollback skips it"
    if m.effect == Effect.irreversible or m.compensation is None:
        return "unrecoverable", None, f"{m.tool} is {m.effect}: nothing can undo it"
    handle, missing = resolve_map(m.compensation.argument_map, args, result, key, before)
    if missing:
        return "unrecoverable", None, "the undo is unavailable: " + "; ".join(missing)
    return "compensate", handle, None


def first_mismatch(expect: Mapping[str, Any], answer: Any) -> str | None:
    """The first ``expect`` entry the answer does not match, as a sentence, or None."""
    for path, want in expect.items():
        current: Any = answer
        for seg in answer_path(path).path:
            if isinstance(seg, int) and isinstance(current, list) and seg < len(current):
                current = current[seg]
            elif isinstance(current, dict) and str(seg) in current:
                current = current[str(seg)]
            else:
                return f"the answer has no {path}, expected {show(want)}"
        if not same(current, want):
            return f"{path} is {show(current)}, expected {show(want)}"
    return None


def absence_problem(absent: Absent, status: int | None, answer: Any) -> str | None:
    """None when a read-back's answer proves the thing gone (``verification.absent``): a
    status it lists (404 and 410 by default), or a 2xx answer that is an empty list or
    matches its ``shape``; else why it does not, as a sentence."""
    code = status or 0
    if code in absent.statuses:
        return None
    listed = ", ".join(str(s) for s in absent.statuses) or "none"
    if not 200 <= code < 300:
        return f"the read-back answered {code}, which is not a status absent lists ({listed})"
    if isinstance(answer, list) and not answer:
        return None
    if absent.shape is not None:
        mismatch = first_mismatch(absent.shape, answer)
        if mismatch is None:
            return None
        return f"it is still there: the read-back answered {code} and {mismatch} (absent.shape)"
    return (f"it is still there: the read-back answered {code} with "
            f"{'no body' if answer is None else 'something'}, not {listed} or an empty list")


def same(a: Any, b: Any) -> bool:
    """Deep JSON equality: a bool never equals a number, 1 equals 1.0."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and bool(a == b)


def show(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)
