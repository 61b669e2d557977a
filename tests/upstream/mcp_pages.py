"""A hostile MCP upstream: a ``tools/list`` of ``--pages`` pages of about ``--page-bytes``
each (tools padded with long descriptions), with ``echo`` on the first page, and, with
``--fan-out``, ``echo``'s input schema made of $defs that each reference the one below
twice (2^24 paths through 24 definitions, 2 KiB of JSON).

    python -m tests.upstream.mcp_pages --port 8790 --pages 30 --page-bytes 3670016
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from starlette.applications import Starlette
from starlette.routing import Mount

ECHO: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}},
                        "required": ["text"]}


def fan_out(levels: int = 24) -> dict[str, Any]:
    defs: dict[str, Any] = {"d0": {"type": "string"}}
    for i in range(1, levels + 1):
        defs[f"d{i}"] = {"allOf": [{"$ref": f"#/$defs/d{i - 1}"}, {"$ref": f"#/$defs/d{i - 1}"}]}
    return {"type": "object", "properties": {"text": {"$ref": f"#/$defs/d{levels}"}}, "$defs": defs}


def app(pages: int, page_bytes: int, fanned: bool) -> Starlette:
    per_tool = 4096
    count = max(1, page_bytes // per_tool)
    padding = "x" * (per_tool - 200)

    def page(n: int) -> list[types.Tool]:
        tools = [types.Tool(name=f"filler_{n}_{i}", description=padding,
                            inputSchema={"type": "object"}) for i in range(count)]
        if n == 0:
            tools[0] = types.Tool(name="echo", inputSchema=fan_out() if fanned else ECHO)
        return tools

    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        cursor = getattr(params, "cursor", None) if params is not None else None
        n = int(cursor) if cursor else 0
        following = str(n + 1) if n + 1 < pages else None
        return types.ListToolsResult(tools=page(n), nextCursor=following)

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structuredContent={"echo": text}, isError=False)

    server = Server("pages", on_list_tools=list_tools, on_call_tool=call_tool)
    sessions = StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with sessions.run():
            yield

    return Starlette(routes=[Mount("/mcp", app=StreamableHTTPASGIApp(sessions))], lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8790)
    parser.add_argument("--pages", type=int, default=1)
    parser.add_argument("--page-bytes", type=int, default=4096)
    parser.add_argument("--fan-out", action="store_true")
    args = parser.parse_args()
    uvicorn.run(app(args.pages, args.page_bytes, args.fan_out), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
