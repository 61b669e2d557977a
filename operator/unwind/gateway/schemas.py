"""The argument check both doors run (REST ``/call``, MCP ``tools/call``) before anything
is recorded: a call's arguments against its tool's input schema.

The schema of a tool is its manifest's ``input_schema`` when it has one; else, for an MCP
upstream, the schema the upstream listed (``tools/list``), unless the manifest pinned
another ``schema_hash`` (then the call is refused as ``schema_drift`` further on, and
recorded), or unless it is not one the gateway can check (logged once); else there is none
and nothing is checked. Arguments that do not conform are
answered ``400 validation_error`` naming each field (``arguments.owner: 'owner' is a
required property``) and not recorded, like the bounds of limits.py: the upstream would
refuse them too, and the agent gets to fix its call first. The check holds in observe
mode as well.

Arguments the schema does not declare are refused the same way (``manifest/declared.py``:
an object schema that lists ``properties`` is read as closed), so a reviewed tool sends
only what it was reviewed for.

The work of a check is bounded (``manifest/schema_work.py``): it runs on the event loop
with ``INLINE_STEPS``, which every ordinary call stays within; a call that needs more is
checked again on a worker thread with the full budget and a deadline, so one hostile call
never holds the loop (``/healthz`` answers meanwhile), and past either it is refused.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..manifest.declared import undeclared
from ..manifest.input_schema import (
    UPSTREAM_DIALECTS,
    SchemaUnusable,
    argument_problems,
    schema_problems,
)
from ..manifest.lint import schema_hash_of
from ..manifest.model import ToolManifest
from ..manifest.schema_work import MAX_STEPS, TooMuchWork, budgeted
from ..upstream.client import Upstream
from ..upstream.errors import Refusal

log = logging.getLogger("unwind.gateway")
_unusable_logged: set[str] = set()
_judged: dict[int, tuple[dict[str, Any], bool]] = {}  # an upstream's listed schema -> usable
INLINE_STEPS = 2_000  # on the event loop: about 10 ms at most; ordinary calls need far fewer
DEADLINE_S = 2.0      # a check on the worker thread, from the moment it is handed over
_workers: ThreadPoolExecutor | None = None


class BadArguments(Refusal):
    """Arguments the tool's input schema refuses: answered at the door, never recorded.
    ``where`` names the failing fields and keywords only (no values), for the log."""

    def __init__(self, message: str, where: str) -> None:
        super().__init__("validation_error", message)
        self.where = where


def listed_key(m: ToolManifest) -> tuple[str, str] | None:
    """Where an MCP upstream's tools/list entry of the tool is kept (``Upstream.schemas``
    and ``.listed``): the server (its ``target``: URL or command) and the tool's name."""
    mcp = m.upstream.mcp if m.upstream is not None else None
    if mcp is None:
        return None
    server: str = getattr(mcp, "target", None) or mcp.url or ""
    return server, mcp.tool


def input_schema(m: ToolManifest, upstream: Upstream) -> dict[str, Any] | None:
    """The schema the tool's arguments are served and checked with, or None."""
    if m.input_schema is not None:
        return m.input_schema
    where = listed_key(m)
    if where is None:
        return None
    listed = upstream.schemas.get(where)
    if listed is None or (m.schema_hash and schema_hash_of(listed) != m.schema_hash):
        return None
    return listed


def _usable(m: ToolManifest, schema: dict[str, Any]) -> bool:
    """A manifest's schema passed validation; an upstream's may not be checkable (another
    dialect, a remote $ref): then it is served as listed and not checked (logged once)."""
    if schema is m.input_schema:
        return True
    known = _judged.get(id(schema))
    if known is not None and known[0] is schema:
        return known[1]
    problems = schema_problems(schema, "inputSchema", UPSTREAM_DIALECTS)
    if len(_judged) > 1024:
        _judged.clear()
    _judged[id(schema)] = (schema, not problems)  # the schema is kept: its id stays its own
    if problems and m.tool not in _unusable_logged:
        _unusable_logged.add(m.tool)
        path, message = problems[0]
        log.warning("the MCP upstream's input schema of %s is not checked at the door: %s %s",
                    m.tool, path, message)
    return not problems


def _problems(m: ToolManifest, schema: dict[str, Any], arguments: dict[str, Any],
              steps: int, deadline: float | None) -> list[tuple[str, str]]:
    """The schema's problems with the arguments, else the undeclared ones; TooMuchWork."""
    problems = argument_problems(schema, arguments, steps=steps, deadline=deadline)
    if problems:
        return problems
    extra = budgeted(steps, deadline, lambda: undeclared(schema, arguments))
    where = "its manifest's input_schema" if schema is m.input_schema else \
        "the inputSchema its MCP server lists"
    return [(path, f"is not declared by {where}: the gateway sends a tool only the arguments "
             "its schema names; leave it out, or declare it (properties)") for path in extra]


def _pool() -> ThreadPoolExecutor:
    global _workers
    if _workers is None:  # two threads: hostile checks queue here, not on the loop
        _workers = ThreadPoolExecutor(max_workers=2, thread_name_prefix="unwind-schema")
    return _workers


async def check_call_arguments(m: ToolManifest | None, arguments: dict[str, Any],
                               upstream: Upstream) -> None:
    """Refuse (``BadArguments``) arguments the tool's schema does not accept, or does not
    declare. A tool that is not served, or has no schema, passes: enforcement answers for
    it."""
    if m is None or not m.enforceable:
        return
    schema = input_schema(m, upstream)
    if schema is None or not _usable(m, schema):
        return
    try:
        try:
            problems = _problems(m, schema, arguments, INLINE_STEPS, None)
        except TooMuchWork:
            deadline = time.monotonic() + DEADLINE_S
            problems = await asyncio.wrap_future(
                _pool().submit(_problems, m, schema, arguments, MAX_STEPS, deadline))
    except TooMuchWork as exc:
        raise BadArguments(f"checking the arguments of {m.tool} against its input schema took "
                           f"more work than the gateway allows ({exc}; at most {MAX_STEPS} "
                           f"steps within {DEADLINE_S:g}s): send smaller arguments, or simplify "
                           "the schema", "input_schema") from None
    except SchemaUnusable as exc:
        raise BadArguments(f"the arguments of {m.tool} cannot be checked against its input "
                           f"schema: {exc}; fix the schema in its manifest", "input_schema") \
            from None
    if not problems:
        return
    text = "; ".join(f"{path}: {message}" for path, message in problems)
    raise BadArguments(f"the arguments do not match the input schema of {m.tool}: {text}",
                       ", ".join(path for path, _ in problems))
