"""The MCP door (``/mcp``, streamable HTTP, the official ``mcp`` SDK).

``tools/list`` lists the served tools, each with its input schema when the upstream's is
known and, in ``_meta``, its effect class and effect contract (undo, lookup, draft), so an
agent knows before calling what can be undone. ``tools/call`` reads ``_meta``
(``idempotency_key``, ``stage``, ``dry_run``; a malformed one is refused) and the run from
the ``X-Unwind-Run`` header, checks the arguments' nesting and size (limits.py; past them
the call is refused unrecorded), then goes through the same ``Gateway.call`` as REST. The
answer carries the effect report in ``_meta.effect``; a refusal is a tool error whose
structured content is the same ``{"error": {...}}`` envelope REST sends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import mcp_types as types
from mcp.server.lowlevel.server import Server

from ..ledger.store import ENTRY_ID_PATTERN
from ..ledger.ulid import new_ulid
from ..manifest.model import ToolManifest
from .enforce import CallRequest, CallResult, Gateway
from .errors import Refusal
from .limits import OverLimit, check_arguments
from .rest import choose_run

META_KEYS = {"idempotency_key": str, "stage": bool, "dry_run": bool}


def contract(m: ToolManifest) -> dict[str, Any]:
    """The declaration an agent reads before calling: how the effect is undone and found."""
    c = m.compensation
    undo = None if c is None else {
        "kind": "inverse" if c.kind == "inverse" else "compensate", "tool": c.tool,
        "argument_map": dict(c.argument_map), "residue": list(c.residue),
        "deadline_ms": c.deadline.within_ms if c.deadline else None}
    lookup = m.lookup.model_dump(mode="json") if m.lookup else None
    draft = m.draft.model_dump(mode="json", exclude_none=True) if m.draft else None
    return {"undo": undo, "lookup": lookup, "draft": draft,
            "approval": m.approval.required, "permission": m.permission}


def read_meta(meta: Mapping[str, Any] | None) -> tuple[str | None, bool, bool]:
    """(idempotency_key, stage, dry_run) from a call's ``_meta``, or a refusal."""
    meta = meta or {}
    for name, kind in META_KEYS.items():
        if name in meta and not isinstance(meta[name], kind):
            raise Refusal("validation_error", f"_meta.{name} must be a "
                          f"{'string' if kind is str else 'boolean'}")
    key = meta.get("idempotency_key")
    if key is not None and not ENTRY_ID_PATTERN.fullmatch(key):
        raise Refusal("validation_error", "_meta.idempotency_key must be 1 to 128 letters, "
                      "digits and '.', '_', ':' or '-' (it becomes the ledger entry id)")
    return key, bool(meta.get("stage", False)), bool(meta.get("dry_run", False))


def tool_result(result: CallResult) -> types.CallToolResult:
    body = result.body
    meta = {"effect": result.report} if result.report else None
    text = json.dumps(body, ensure_ascii=False)
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structuredContent=body if isinstance(body, dict) else None,
        isError=result.status >= 400, _meta=meta)


def refusal_result(refusal: Refusal) -> types.CallToolResult:
    return tool_result(CallResult(refusal.status, refusal.envelope()))


def build_server(gateway: Gateway, default_run: str | None) -> Server[Any]:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        tools = []
        for served in gateway.catalogue.tools():
            m = served.manifest
            if not m.enforceable:
                continue
            schema: dict[str, Any] = {"type": "object"}
            if m.upstream is not None and m.upstream.mcp is not None:
                schema = gateway.upstream.schemas.get((m.upstream.mcp.url, m.upstream.mcp.tool),
                                                      schema)
            tools.append(types.Tool(name=m.tool, description=m.description, inputSchema=schema,
                                    _meta={"unwind.dev/effect_class": str(m.effect),
                                           "unwind.dev/effect_contract": contract(m)}))
        return types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", None) or {}
        try:
            run = choose_run(headers.get("x-unwind-run"), default_run)
        except Refusal as refusal:
            return refusal_result(refusal)
        meta = ctx.meta if isinstance(getattr(ctx, "meta", None), Mapping) else params.meta
        req = CallRequest(tool=params.name, arguments={}, run=run, entry_id=new_ulid())
        try:
            key, stage, dry_run = read_meta(meta if isinstance(meta, Mapping) else None)
            arguments = params.arguments or {}
            if not isinstance(arguments, dict):
                raise Refusal("validation_error", "arguments must be an object")
            check_arguments(arguments)
        except OverLimit as refusal:  # refused at the door: nothing of it reaches the ledger
            return refusal_result(refusal)
        except Refusal as refusal:
            return tool_result(await gateway.reject(req, refusal))
        req = CallRequest(tool=params.name, arguments=dict(arguments), run=run,
                          entry_id=key or req.entry_id, stage=stage, dry_run=dry_run)
        return tool_result(await gateway.call(req))

    return Server("unwind-gateway", on_list_tools=list_tools, on_call_tool=call_tool)
