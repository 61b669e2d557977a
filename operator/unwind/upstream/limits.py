"""Bounds on what a call may carry, shared by both doors (REST ``/call`` and MCP
``tools/call``) and by the upstream client for answers.

Why: a value nested a few hundred levels deep parses, but the gateway cannot serialise it
again (the ledger's digest, the handle, the answer to the agent each recurse), so it
would fail after the write-ahead with the upstream already called. Each door checks the
arguments here before anything is written to the ledger; the refusal names the bound.

- ``MAX_DEPTH``: objects and arrays nest at most 64 levels, the arguments object itself
  being level 1 (an upstream's answer: the answer itself being level 1).
- ``MAX_BODY``: a request body (REST and MCP) is at most 64 KiB, and the arguments,
  written as compact JSON, at most as much: arguments are for calls, not for documents.

The walk is iterative, so the check itself cannot run out of stack.
"""

from __future__ import annotations

import json
from typing import Any

from ..ledger.handle import nesting_problem
from .errors import Refusal

MAX_DEPTH = 64
__all__ = ["MAX_BODY", "MAX_DEPTH", "OverLimit", "check_arguments", "nesting_problem"]
MAX_BODY = 64 * 1024
MAX_ARGUMENT_BYTES = MAX_BODY


class OverLimit(Refusal):
    """A refusal at the door for a bound of this module: answered, never recorded."""

    def __init__(self, message: str) -> None:
        super().__init__("validation_error", message)


def too_deep() -> OverLimit:
    return OverLimit(f"the arguments are nested deeper than {MAX_DEPTH} levels of objects and "
                     "arrays (the gateway's bound): send flatter arguments")


def check_arguments(arguments: Any) -> None:
    """Refuse arguments nested deeper than ``MAX_DEPTH`` or larger than
    ``MAX_ARGUMENT_BYTES`` as compact JSON (``OverLimit``, naming the bound)."""
    if nesting_problem(arguments, MAX_DEPTH) is not None:
        raise too_deep()
    try:
        size = len(json.dumps(arguments, ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False).encode())
    except (TypeError, ValueError) as exc:
        raise OverLimit(f"the arguments are not JSON: {exc}") from None
    if size > MAX_ARGUMENT_BYTES:
        raise OverLimit(f"the arguments are {size} bytes as JSON, more than "
                      f"the gateway's bound of {MAX_ARGUMENT_BYTES // 1024} KiB: send less "
                      "(arguments are for calls, not for documents)")
