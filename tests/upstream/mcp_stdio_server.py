"""A small MCP server (the SDK's MCPServer, formerly FastMCP) the gateway starts as a stdio
upstream (``upstream.mcp.command``), or serves over streamable HTTP for the pool's tests.

Tools: ``echo``; ``remember``/``recall``/``forget`` (a dict in the process: a restart forgets
it, which is how a test sees a new process); ``pid`` (which process answered); ``crash``
(the process exits at once, after printing a line to stderr); ``slow`` (reports progress and
a log message at each step, and says on stderr when it finishes or is cancelled).

    python -m tests.upstream.mcp_stdio_server                      # stdio
    python -m tests.upstream.mcp_stdio_server --port 8790 --stateful   # HTTP, Mcp-Session-Id
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("unwind-test-stdio")
memory: dict[str, str] = {}


@server.tool()
def echo(text: str) -> dict[str, Any]:
    """Answer the text back."""
    return {"echo": text}


@server.tool()
def remember(key: str, value: str) -> dict[str, Any]:
    """Keep a value under a key (in this process only)."""
    memory[key] = value
    return {"key": key, "stored": True}


@server.tool()
def recall(key: str) -> dict[str, Any]:
    """The value under a key, or found: false."""
    return {"key": key, "found": key in memory, "value": memory.get(key)}


@server.tool()
def forget(key: str) -> dict[str, Any]:
    """Drop a key."""
    return {"key": key, "forgotten": memory.pop(key, None) is not None}


@server.tool()
def pid() -> dict[str, Any]:
    """The process id of the server that answered."""
    return {"pid": os.getpid()}


@server.tool()
def crash() -> dict[str, Any]:
    """Exit the process at once (a server that dies mid-call)."""
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
async def slow(steps: int, ctx: Context, step_s: float = 0.2, tag: str = "") -> dict[str, Any]:
    """Count to ``steps``, one step every ``step_s`` seconds, reporting progress and logging."""
    try:
        for i in range(1, steps + 1):
            await asyncio.sleep(step_s)
            await ctx.report_progress(i, steps, f"step {i} of {steps}")
            await ctx.info(f"slow {tag} reached step {i}")
    except asyncio.CancelledError:
        print(f"slow {tag} was cancelled", file=sys.stderr, flush=True)
        raise
    print(f"slow {tag} finished", file=sys.stderr, flush=True)
    return {"steps": steps, "tag": tag}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, help="serve streamable HTTP here instead of stdio")
    parser.add_argument("--stateful", action="store_true",
                        help="HTTP with sessions (Mcp-Session-Id) rather than stateless")
    args = parser.parse_args()
    print("unwind test MCP server ready", file=sys.stderr, flush=True)
    if args.port is None:
        server.run()
        return
    import uvicorn

    app = server.streamable_http_app(stateless_http=not args.stateful, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
