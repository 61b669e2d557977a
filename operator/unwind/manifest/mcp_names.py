"""The names tools are served under over MCP.

Model APIs take tool names matching ``^[a-zA-Z0-9_-]{1,64}$`` (some refuse a dot), while a
manifest's tool name may hold ``.``, ``:`` and ``/`` and run to 128 characters. So the MCP
door serves every tool under a name of that form, always:

- each ``.``, ``:`` and ``/`` becomes ``__`` (``github.create_issue`` ->
  ``github__create_issue``); a name of the form already is served unchanged;
- a result longer than 64 characters keeps its first 55 and ends ``_`` plus the first 8
  hex digits of the SHA-256 of the manifest's name.

Two tools of one catalogue served under the same name (``a.b`` and ``a__b``) are refused
when the catalogue loads. ``tools/call`` takes the served name (or still the manifest's
own); REST and the ledger keep the manifest's name.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

MODEL_API_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # fullmatch
MAX_LENGTH = 64
_OTHER = re.compile(r"[.:/]")


def mcp_name(tool: str) -> str:
    """The name ``tool`` is served under over MCP."""
    if MODEL_API_NAME.fullmatch(tool):
        return tool
    name = _OTHER.sub("__", tool)
    if len(name) > MAX_LENGTH:
        name = name[:MAX_LENGTH - 9] + "_" + hashlib.sha256(tool.encode()).hexdigest()[:8]
    return name


def name_collisions(tools: Iterable[str]) -> list[tuple[str, list[str]]]:
    """``(served name, [tools])`` for every served name two or more tools would share."""
    by_name: dict[str, list[str]] = {}
    for tool in tools:
        by_name.setdefault(mcp_name(tool), []).append(tool)
    return sorted((name, sorted(set(ts))) for name, ts in by_name.items() if len(set(ts)) > 1)


def collision_message(collisions: list[tuple[str, list[str]]]) -> str:
    return "; ".join(f"tools {' and '.join(ts)} would both be served over MCP as {name!r} "
                     "(dots, colons and slashes become __): rename one" for name, ts in collisions)
