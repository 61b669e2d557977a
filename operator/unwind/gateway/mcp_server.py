"""The MCP door (``/mcp``, streamable HTTP, the official ``mcp`` SDK).

``tools/list`` lists the served tools, each with its input schema when the upstream's is
known and, in ``_meta``, its effect class and effect contract (undo, lookup, draft), so an
agent knows before calling what can be undone. ``tools/call`` reads ``_meta``
(``idempotency_key``, ``stage``, ``dry_run``; a malformed one is refused) and the run from
the ``X-Unwind-Run`` header, checks the arguments' nesting and size (limits.py; past them
the call is refused unrecorded), then goes through the same ``Gateway.call`` as REST, in a
task of its own that relays the upstream's progress and log messages and the client's
cancellation (mcp_stream.py). The answer carries the effect report in ``_meta.effect``
(and, asked for in content, where a client that keeps less finds it: report_placed); an MCP
upstream's result and listing pass on as it sent them; a refusal is a tool error whose
structured content is the same ``{"error": {...}}`` envelope REST sends.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import jsonschema
import mcp_types as types
from mcp.server.lowlevel.server import Server

from ..ledger.store import ENTRY_ID_PATTERN
from ..ledger.ulid import new_ulid
from ..manifest.mcp_names import mcp_name
from ..manifest.model import Effect, ToolManifest
from ..upstream.errors import Refusal
from ..upstream.limits import OverLimit, check_arguments
from .enforce import CallRequest, CallResult, Gateway
from .mcp_stream import InFlight
from .rest import choose_run
from .schemas import BadArguments, check_call_arguments, listed_key
from .stages.admission import annotate

log = logging.getLogger("unwind.gateway")
META_KEYS = {"idempotency_key": str, "stage": bool, "dry_run": bool}
REPORT_IN_CONTENT_HEADER = "x-unwind-report"
REPORT_IN_CONTENT_ENV = "UNWIND_REPORT_IN_CONTENT"
REPORT_PREFIX = "unwind effect report (how this call is recorded and undone): "
REPORT_KEY = "unwind.dev/effect"  # the report inside structured content (report_placed)


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


def report_block(report: dict[str, Any]) -> types.TextContent:
    """The effect report as a text block, for clients that drop ``_meta``."""
    text = json.dumps(report, ensure_ascii=False, separators=(",", ":"))
    return types.TextContent(type="text", text=f"{REPORT_PREFIX}{text}")


def tool_result(result: CallResult, *, report_in_content: bool = False,
                output_schema: dict[str, Any] | None = None) -> types.CallToolResult:
    """The answer: an MCP upstream's own result as it sent it (its blocks, an image stays an
    image, and its structured content, or none), else the body as one JSON text block and,
    for an object, as structured content; the report in ``_meta.effect`` and, with
    ``report_in_content``, where a client that keeps less finds it too (report_placed)."""
    body = result.body
    meta = {"effect": result.report} if result.report else None
    content: list[Any]
    structured: dict[str, Any] | None
    if result.content is not None and result.status < 400:
        content = list(result.content.blocks)
        structured = result.content.structured
    else:
        content = [types.TextContent(type="text", text=json.dumps(body, ensure_ascii=False))]
        structured = body if isinstance(body, dict) else None
    if report_in_content and result.report:
        content.append(report_block(result.report))
        structured = report_placed(structured, result.report, output_schema)
    return types.CallToolResult(content=content, structuredContent=structured,
                                isError=result.status >= 400, _meta=meta)


def report_placed(structured: dict[str, Any] | None, report: dict[str, Any],
                  output_schema: dict[str, Any] | None) -> dict[str, Any] | None:
    """The structured content of an answer whose report was asked for in content. Some
    clients keep only the structured content when there is some (pydantic-ai: MCP says the
    text blocks are its serialization) and drop ``_meta``, so the report must be in it too:
    a tool without an output schema gets none (the text blocks, answer and report, are
    the whole answer); one whose output schema takes the report under ``REPORT_KEY`` gets it
    there; one whose schema does not (``additionalProperties: false``) keeps its structured
    content as the upstream sent it, and the report is in the last text block only."""
    if structured is None or output_schema is None:
        return None
    placed = {**structured, REPORT_KEY: report}
    try:
        validator = jsonschema.validators.validator_for(output_schema)(output_schema)
        return placed if validator.is_valid(placed) else structured
    except (jsonschema.SchemaError, jsonschema.exceptions.UnknownType, RecursionError):
        return structured


def refusal_result(refusal: Refusal, *, report_in_content: bool = False) -> types.CallToolResult:
    return tool_result(CallResult(refusal.status, refusal.envelope()),
                       report_in_content=report_in_content)


def output_schema(m: ToolManifest | None, gateway: Gateway) -> dict[str, Any] | None:
    """The output schema tools/list serves for the tool (its MCP upstream's), or None."""
    where = listed_key(m) if m is not None else None
    schema = gateway.upstream.listed.get(where, {}).get("outputSchema") if where else None
    return schema if isinstance(schema, dict) else None


def hints(m: ToolManifest) -> dict[str, bool]:
    """MCP's behaviour hints, from the declared effect class (the reviewed truth, over what
    an upstream says): read-only is read_only; idempotent is read_only or idempotent;
    destructive is what Unwind cannot put back exactly (idempotent, compensable,
    irreversible), so only a reversible tool (or a read) is not destructive."""
    effect = m.effect
    return {"readOnlyHint": effect == Effect.read_only,
            "destructiveHint": effect in (Effect.idempotent, Effect.compensable,
                                          Effect.irreversible),
            "idempotentHint": effect in (Effect.read_only, Effect.idempotent)}


DECIDED = frozenset({"name", "description", "inputSchema", "annotations", "_meta"})
KNOWN = frozenset({f.alias or name for name, f in types.Tool.model_fields.items()} | {"_meta"})


def served_tool(m: ToolManifest, gateway: Gateway) -> types.Tool:
    """One tools/list entry: the model-API name, the argument schema (the manifest's, else
    the MCP upstream's, else any object), the upstream's annotations with the hints of the
    effect class, in ``_meta`` the manifest's name, effect class and contract, and every
    other field the upstream listed as it listed it (outputSchema, title, execution,
    icons...; fields the SDK does not know are added by the door: unknown_fields)."""
    listed = _listed(m, gateway)
    schema: dict[str, Any] = {"type": "object"}
    where = listed_key(m)
    if where is not None:
        schema = gateway.upstream.schemas.get(where, schema)
    if m.input_schema is not None:
        schema = m.input_schema
    annotations = listed.get("annotations")
    annotations = {**(annotations if isinstance(annotations, dict) else {}), **hints(m)}
    own = {"name": mcp_name(m.tool), "description": m.description or listed.get("description"),
           "inputSchema": schema, "annotations": annotations,
           "_meta": {"unwind.dev/tool": m.tool, "unwind.dev/effect_class": str(m.effect),
                     "unwind.dev/effect_contract": contract(m)}}
    passed = {k: v for k, v in listed.items() if k in KNOWN and k not in DECIDED}
    try:
        return types.Tool.model_validate({**passed, **own})
    except ValueError:  # a field the upstream got wrong: the gateway's own fields only
        return types.Tool.model_validate(own)


def _listed(m: ToolManifest, gateway: Gateway) -> dict[str, Any]:
    where = listed_key(m)
    return gateway.upstream.listed.get(where, {}) if where is not None else {}


def unknown_fields(gateway: Gateway) -> dict[str, dict[str, Any]]:
    """By MCP name: the fields an upstream listed for a tool that the SDK's Tool does not
    know (a later revision's), which the SDK drops when it writes tools/list; the door
    adds them back (mcp_stream.py), so a client sees the tool as the upstream listed it."""
    found: dict[str, dict[str, Any]] = {}
    for served in gateway.catalogue.tools():
        extra = {k: v for k, v in _listed(served.manifest, gateway).items()
                 if k not in DECIDED}
        if extra and served.manifest.enforceable:
            found[mcp_name(served.manifest.tool)] = extra
    return found


def wants_report_in_content(headers: Mapping[str, str], default: bool) -> bool:
    """``X-Unwind-Report: content`` asks for it on one request; ``: meta`` declines it."""
    value = (headers.get(REPORT_IN_CONTENT_HEADER) or "").strip().lower()
    return default if value not in ("content", "meta") else value == "content"


def report_in_content_default() -> bool:
    return os.environ.get(REPORT_IN_CONTENT_ENV, "").strip().lower() in ("1", "true", "yes")


def build_server(gateway: Gateway, default_run: str | None,
                 report_in_content: bool | None = None,
                 inflight: InFlight | None = None) -> Server[Any]:
    """``report_in_content`` (default: ``UNWIND_REPORT_IN_CONTENT``) adds the effect report
    as a last text block to every answer; a request's ``X-Unwind-Report`` header decides
    for itself. ``inflight`` holds the calls running now (for a client's cancellation)."""
    in_content = report_in_content_default() if report_in_content is None else report_in_content
    inflight = inflight if inflight is not None else InFlight()

    names: dict[str, dict[str, str]] = {}  # catalogue generation -> MCP name -> tool

    def tool_of(name: str) -> ToolManifest | None:
        """The manifest a tools/call names: by its served name, else by its own name."""
        generation = gateway.catalogue.generation
        by_name = names.get(generation)
        if by_name is None:  # once per catalogue generation, not per call
            by_name = {mcp_name(s.manifest.tool): s.manifest.tool
                       for s in gateway.catalogue.tools()}
            names.clear()
            names[generation] = by_name
        served = gateway.catalogue.get(by_name.get(name, name))
        return served.manifest if served is not None else None

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[served_tool(s.manifest, gateway)
                                            for s in gateway.catalogue.tools()
                                            if s.manifest.enforceable])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        request = getattr(ctx, "request", None)
        headers = getattr(request, "headers", None) or {}
        scope = getattr(request, "scope", None) or {}
        gw = scope.get("unwind.gateway") or gateway  # the authenticated caller's (gateway/auth)
        report = wants_report_in_content(headers, in_content)
        try:
            run = choose_run(headers.get("x-unwind-run"), default_run)
        except Refusal as refusal:
            return refusal_result(refusal, report_in_content=report)
        m = tool_of(params.name)
        tool = m.tool if m is not None else params.name
        meta = ctx.meta if isinstance(getattr(ctx, "meta", None), Mapping) else params.meta
        req = CallRequest(tool=tool, arguments={}, run=run, entry_id=new_ulid())
        try:
            key, stage, dry_run = read_meta(meta if isinstance(meta, Mapping) else None)
            arguments = params.arguments or {}
            if not isinstance(arguments, dict):
                raise Refusal("validation_error", "arguments must be an object")
            check_arguments(arguments)
            await check_call_arguments(m, arguments, gateway.upstream)
        except BadArguments as refusal:  # refused at the door, not recorded: no values logged
            log.info("call run=%s tool=%s status=%d outcome=%s fields=%s (not recorded)", run,
                     tool[:128], refusal.status, refusal.code, refusal.where)
            return refusal_result(refusal, report_in_content=report)
        except OverLimit as refusal:  # refused at the door: nothing of it reaches the ledger
            return refusal_result(refusal, report_in_content=report)
        except Refusal as refusal:
            return tool_result(await gw.reject(req, refusal), report_in_content=report)
        req = CallRequest(tool=tool, arguments=dict(arguments), run=run,
                          entry_id=key or req.entry_id, stage=stage, dry_run=dry_run)
        # In a task of its own, relaying progress (mcp_stream.py): recorded whatever the client does
        result = await inflight.run(ctx, run, gw.call(req))
        annotate(gw, tool, run, result)
        return tool_result(result, report_in_content=report, output_schema=output_schema(m, gw))

    return Server("unwind-gateway", on_list_tools=list_tools, on_call_tool=call_tool)
