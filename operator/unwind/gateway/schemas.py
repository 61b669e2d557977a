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
"""

from __future__ import annotations

import logging
from typing import Any

from ..manifest.input_schema import (
    UPSTREAM_DIALECTS,
    SchemaUnusable,
    argument_problems,
    schema_problems,
)
from ..manifest.lint import schema_hash_of
from ..manifest.model import ToolManifest
from ..upstream.client import Upstream
from ..upstream.errors import Refusal

log = logging.getLogger("unwind.gateway")
_unusable_logged: set[str] = set()
_judged: dict[int, tuple[dict[str, Any], bool]] = {}  # an upstream's listed schema -> usable


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


def check_call_arguments(m: ToolManifest | None, arguments: dict[str, Any],
                         upstream: Upstream) -> None:
    """Refuse (``BadArguments``) arguments the tool's schema does not accept. A tool that is
    not served, or has no schema, passes: enforcement answers for it."""
    if m is None or not m.enforceable:
        return
    schema = input_schema(m, upstream)
    if schema is None or not _usable(m, schema):
        return
    try:
        problems = argument_problems(schema, arguments)
    except SchemaUnusable as exc:
        raise BadArguments(f"the arguments of {m.tool} cannot be checked against its input "
                           f"schema: {exc}; fix the schema in its manifest", "input_schema") \
            from None
    if not problems:
        return
    text = "; ".join(f"{path}: {message}" for path, message in problems)
    raise BadArguments(f"the arguments do not match the input schema of {m.tool}: {text}",
                       ", ".join(path for path, _ in problems))
