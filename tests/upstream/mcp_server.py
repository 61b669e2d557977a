"""A test MCP upstream: one tool, ``echo``, over streamable HTTP at ``/mcp``.

``--changed`` serves a different input schema for ``echo`` (an added required field), so a
gateway whose manifest pinned the original ``schema_hash`` sees schema drift.

    python -m tests.upstream.mcp_server --port 8789 [--changed]
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

SCHEMA: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"}},
                          "required": ["text"]}
CHANGED: dict[str, Any] = {"type": "object", "properties": {"text": {"type": "string"},
                                                            "loud": {"type": "boolean"}},
                           "required": ["text", "loud"]}


def app(changed: bool = False) -> Starlette:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[types.Tool(name="echo", inputSchema=CHANGED if changed
                                                       else SCHEMA)])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        text = str((params.arguments or {}).get("text", ""))
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)],
                                    structuredContent={"echo": text}, isError=False)

    server = Server("test-upstream", on_list_tools=list_tools, on_call_tool=call_tool)
    sessions = StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with sessions.run():
            yield

    return Starlette(routes=[Mount("/mcp", app=StreamableHTTPASGIApp(sessions))], lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8789)
    parser.add_argument("--changed", action="store_true")
    args = parser.parse_args()
    uvicorn.run(app(args.changed), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
