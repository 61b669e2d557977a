"""A test MCP upstream whose tools answer as real MCP servers often do: ``snapshot`` with an
image and a text block (no structured content), ``lookup`` with structured content under a
declared ``outputSchema``, and annotations (title, hints) on both.

    python -m tests.upstream.mcp_blocks --port 8790
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

PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
SNAPSHOT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"name": {"type": "string"}},
                                   "required": ["name"]}
LOOKUP_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"key": {"type": "string"}},
                                 "required": ["key"]}
LOOKUP_OUTPUT: dict[str, Any] = {"type": "object", "properties": {"key": {"type": "string"},
                                                                  "value": {"type": "integer"}},
                                 "required": ["key", "value"]}


def app() -> Starlette:
    async def list_tools(ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name="snapshot", inputSchema=SNAPSHOT_SCHEMA, title="Take a snapshot",
                       annotations=types.ToolAnnotations(title="Snapshot", readOnlyHint=True,
                                                         destructiveHint=False,
                                                         openWorldHint=False)),
            types.Tool(name="lookup", inputSchema=LOOKUP_SCHEMA, outputSchema=LOOKUP_OUTPUT,
                       annotations=types.ToolAnnotations(openWorldHint=True))])

    async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        arguments = params.arguments or {}
        if params.name == "snapshot":
            return types.CallToolResult(content=[
                types.ImageContent(type="image", data=PNG, mimeType="image/png"),
                types.TextContent(type="text", text=f"snapshot of {arguments.get('name')}")])
        value = {"key": str(arguments.get("key")), "value": 7}
        return types.CallToolResult(content=[types.TextContent(type="text", text="key = 7")],
                                    structuredContent=value)

    server = Server("test-blocks", on_list_tools=list_tools, on_call_tool=call_tool)
    sessions = StreamableHTTPSessionManager(app=server, stateless=True, json_response=True)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        async with sessions.run():
            yield

    return Starlette(routes=[Mount("/mcp", app=StreamableHTTPASGIApp(sessions))], lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8790)
    args = parser.parse_args()
    uvicorn.run(app(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
