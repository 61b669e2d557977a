"""A test MCP upstream written without an SDK (plain JSON-RPC over HTTP, handshake era,
stateless), so it can list what an SDK would not: a tool field of a later revision
(``x-later-field``) beside ``execution``, and a tool (``read_image``) whose output schema is
``{"content": [...]}`` and whose result's structured content equals its content blocks, as
an image-reading server answers. ``broken`` answers ``isError: true``; ``strict_lookup``'s
output schema takes no other property (``additionalProperties: false``).

    python -m tests.upstream.mcp_raw --port 8791
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
LATER = {"x-later-field": {"kept": True}}
BLOCKS_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"content": {"type": "array"}},
                                 "required": ["content"]}
TOOLS: list[dict[str, Any]] = [
    {"name": "read_image", "inputSchema": {"type": "object", "properties": {
        "path": {"type": "string"}}, "required": ["path"]},
     "outputSchema": BLOCKS_SCHEMA, "execution": {"taskSupport": "optional"}, **LATER},
    {"name": "broken", "inputSchema": {"type": "object"}},
    {"name": "strict_lookup", "inputSchema": {"type": "object"}, "outputSchema": {
        "type": "object", "properties": {"key": {"type": "string"}},
        "additionalProperties": False}},
]


def result_of(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    if name == "broken":
        return {"content": [{"type": "text", "text": "the disk is full"}], "isError": True}
    if name == "strict_lookup":
        return {"content": [{"type": "text", "text": '{"key": "k"}'}],
                "structuredContent": {"key": "k"}}
    blocks = [{"type": "image", "data": PNG, "mimeType": "image/png"},
              {"type": "text", "text": f"read {arguments.get('path')}"}]
    return {"content": blocks, "structuredContent": {"content": blocks}, "isError": False}


async def mcp(request: Request) -> Response:
    message = await request.json()
    if "id" not in message:
        return Response(status_code=202)
    method, rid = message.get("method"), message["id"]
    params = message.get("params") or {}
    if method == "initialize":
        result: dict[str, Any] = {"protocolVersion": params.get("protocolVersion", "2025-06-18"),
                                  "capabilities": {"tools": {}},
                                  "serverInfo": {"name": "raw-test", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": TOOLS}
    elif method == "tools/call":
        result = result_of(params.get("name", ""), params.get("arguments") or {})
    elif method == "ping":
        result = {}
    else:
        return JSONResponse({"jsonrpc": "2.0", "id": rid,
                             "error": {"code": -32601, "message": f"no method {method}"}})
    return JSONResponse({"jsonrpc": "2.0", "id": rid, "result": result})


def app() -> Starlette:
    return Starlette(routes=[Route("/mcp", mcp, methods=["POST"]),
                             Route("/mcp", lambda _: Response(status_code=405), methods=["GET"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8791)
    args = parser.parse_args()
    uvicorn.run(app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
