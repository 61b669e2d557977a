"""The effect report reaches an agent built with a real framework's MCP adapter (issue 30
#5): pydantic-ai's ``MCPToolset`` keeps only a result's structured content when it has
some (MCP says the text blocks are its serialization) and drops ``_meta``, so the report
asked for in content must be found in what it keeps. pydantic-ai-slim is a dev dependency
(it runs with the project's own ``mcp``); the agent's model is pydantic-ai's
``FunctionModel``, which calls the tool and records what the model is given back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from unwind.gateway.mcp_server import REPORT_KEY, REPORT_PREFIX

from .conftest import GatewayProc, start_gateway, stop

COMMENT = {"repo": "octo/hello", "issue": 30, "client_id": "pydantic-ai", "body": "from an agent"}


async def what_the_model_sees(url: str, run: str, tool: str, arguments: dict[str, Any],
                              report: str) -> Any:
    """Run a one-tool agent; the tool's return as pydantic-ai gives it to the model."""
    seen: list[Any] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in getattr(m, "parts", [])
                   if isinstance(p, ToolReturnPart)]
        if not returns:
            return ModelResponse(parts=[ToolCallPart(tool, arguments)])
        seen.append(returns[0].content)
        return ModelResponse(parts=[TextPart("done")])
    toolset = MCPToolset(f"{url}/mcp", headers={"X-Unwind-Run": run, "X-Unwind-Report": report})
    agent = Agent(FunctionModel(model), toolsets=[toolset])
    async with agent:
        await agent.run("leave a comment")
    [content] = seen
    return content


def reports_in(content: Any) -> list[dict[str, Any]]:
    parts = content if isinstance(content, list) else [content]
    found = [json.loads(p[len(REPORT_PREFIX):]) for p in parts
             if isinstance(p, str) and p.startswith(REPORT_PREFIX)]
    found += [p[REPORT_KEY] for p in parts if isinstance(p, dict) and REPORT_KEY in p]
    return found


async def test_a_pydantic_ai_agent_sees_the_undo_of_a_rest_tool_when_it_asks_for_the_report(
        gateway: GatewayProc, run_name: str) -> None:
    content = await what_the_model_sees(gateway.url, run_name, "github__create_comment",
                                        COMMENT, "content")
    [report] = reports_in(content)
    assert report["undo"]["tool"] == "github.delete_comment", content
    [entry] = gateway.entries(run_name)
    assert report["ledger"] == {"name": run_name, "entry": entry["id"]}
    answer = content[0] if isinstance(content[0], dict) else json.loads(content[0])
    assert answer["body"] == "from an agent"  # the answer itself (its text, read as JSON)


async def test_without_the_opt_in_pydantic_ai_keeps_the_structured_answer_and_no_report(
        gateway: GatewayProc, run_name: str) -> None:
    # why the placement matters: this adapter keeps structured content alone
    content = await what_the_model_sees(gateway.url, run_name, "github__create_comment",
                                        COMMENT, "meta")
    assert isinstance(content, dict) and content["body"] == "from an agent"
    assert reports_in(content) == []


async def test_a_pydantic_ai_agent_sees_the_report_inside_an_mcp_tools_structured_answer(
        tmp_path: Path) -> None:
    from .test_mcp_answers import serve
    blocks = serve("mcp_blocks", tmp_path)
    url = next(blocks)
    (tmp_path / "m.yaml").write_text(f"""- tool: kv.lookup
  effect: read_only
  permission: test:write
  upstream: {{ mcp: {{ url: "{url}", tool: lookup }} }}
""")
    gw = start_gateway(tmp_path / "m.yaml", tmp_path / "ledger", tmp_path)
    try:
        content = await what_the_model_sees(gw.url, "run-kv", "kv__lookup", {"key": "k"},
                                            "content")
    finally:
        stop(gw.proc)
        blocks.close()
    assert isinstance(content, dict) and content["value"] == 7, content
    [report] = reports_in(content)
    assert report["class"] == "read_only" and report["ledger"]["name"] == "run-kv"


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
