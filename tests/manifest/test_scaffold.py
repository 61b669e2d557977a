"""`unwind manifests scaffold`: draft manifests from a small MCP server (its tools/list, over
the SDK's in-memory transport and over streamable HTTP) and from a small OpenAPI document.
The drafts validate as written, lint lists exactly the TODOs written (L038), and the
suggested effects follow the annotations and methods."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
import yaml
from mcp.server.mcpserver import MCPServer
from mcp_types import ToolAnnotations

from unwind.cli.check_cmds import mcp_tools
from unwind.cli.main import main
from unwind.manifest.lint import lint, schema_hash_of
from unwind.manifest.loader import check, load_text
from unwind.manifest.scaffold import Draft, from_mcp, from_openapi


def memory_server() -> MCPServer:
    """A server-memory-like MCP server: a batch create, its batch delete, a read."""
    server = MCPServer("memory")

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def read_graph() -> dict[str, Any]:
        """Read the whole knowledge graph."""
        return {}

    @server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=False))
    def create_entities(entities: list[dict[str, Any]]) -> dict[str, Any]:
        """Create entities in the graph."""
        return {}

    @server.tool(annotations=ToolAnnotations(destructiveHint=True, idempotentHint=True))
    def delete_entities(entityNames: list[str]) -> dict[str, Any]:
        """Delete entities by name."""
        return {}

    @server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=True))
    def tag_entity(name: str, tag: str) -> dict[str, Any]:
        """Set a tag."""
        return {}

    @server.tool()
    def send_summary(to: str) -> dict[str, Any]:
        """E-mail a summary (no annotations)."""
        return {}

    return server


OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3", "info": {"title": "Items", "version": "1"},
    "servers": [{"url": "https://api.example.com/{version}", "variables": {"version": {"default": "v1"}}}],
    "components": {"schemas": {"NewItem": {"type": "object", "required": ["name"], "properties": {
        "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}}}}},
    "paths": {
        "/items": {
            "get": {"operationId": "listItems", "parameters": [
                {"name": "limit", "in": "query", "schema": {"type": "integer"}}]},
            "post": {"operationId": "createItem", "summary": "Create an item.", "requestBody": {
                "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewItem"}}}}},
        },
        "/items/{id}": {
            "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "get": {"operationId": "getItem"},
            "put": {"operationId": "replaceItem", "requestBody": {"content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/NewItem"}}}}},
            "patch": {"operationId": "updateItem", "requestBody": {"content": {"application/json": {
                "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}}}},
            "delete": {"operationId": "deleteItem"},
        },
        "/notes": {"post": {"operationId": "createNote"}},
    },
}


def checked(drafts: list[Draft]) -> Any:
    loaded = load_text("\n---\n".join(d.text for d in drafts), "drafts.yaml")
    result = check(loaded)
    assert result.issues == [], [str(i) for i in result.issues]
    return result


def todo_count(drafts: list[Draft]) -> int:
    return sum(line.lstrip().startswith("# TODO") for d in drafts for line in d.text.splitlines())


def assert_lint_lists_exactly_the_todos(drafts: list[Draft]) -> None:
    result = checked(drafts)
    todos = {src.data["tool"]: src.todos for src in result.sources if src.todos}
    found = [f for f in lint(result.manifests, todos=todos) if f.code == "L038"]
    assert len(found) == todo_count(drafts) == sum(len(d.todos) for d in drafts) > 0
    assert sorted((f.tool, f"{f.path}: {f.message.removeprefix('TODO left: ')}") for f in found) == sorted(
        (d.tool, f"{t} (decide, write it in the manifest, then remove the comment)")
        for d in drafts for t in d.todos)


def by_tool(drafts: list[Draft]) -> dict[str, dict[str, Any]]:
    return {d.tool: yaml.safe_load(d.text) for d in drafts}


# ---- MCP -------------------------------------------------------------------------------------

URL = "http://127.0.0.1:9/mcp"


def test_mcp_tools_are_read_from_the_server_with_their_schemas_and_annotations() -> None:
    tools = {t["name"]: t for t in mcp_tools(memory_server())}
    assert set(tools) == {"read_graph", "create_entities", "delete_entities", "tag_entity", "send_summary"}
    assert tools["read_graph"]["annotations"] == {"readOnlyHint": True}
    assert tools["delete_entities"]["inputSchema"]["properties"]["entityNames"]["type"] == "array"


def test_effects_are_suggested_from_mcp_annotations_and_marked_for_review() -> None:
    drafts = from_mcp(mcp_tools(memory_server()), URL, prefix="memory.")
    m = by_tool(drafts)
    assert {t: s["effect"] for t, s in m.items()} == {
        "memory.read_graph": "read_only",          # readOnlyHint
        "memory.create_entities": "compensable",   # adds, and delete_entities undoes it
        "memory.delete_entities": "irreversible",  # destructiveHint
        "memory.tag_entity": "idempotent",         # idempotentHint, not destructive
        "memory.send_summary": "irreversible",     # no annotations: MCP assumes destructive
    }
    texts = {d.tool: d.text for d in drafts}
    assert "effect: read_only  # suggested from readOnlyHint: true; review" in texts["memory.read_graph"]
    assert all(s["lifecycle"] == "draft" for s in m.values())
    create = m["memory.create_entities"]
    assert create["upstream"] == {"mcp": {"url": URL, "tool": "create_entities"}}
    assert create["compensation"]["tool"] == "memory.delete_entities"
    tools = {t["name"]: t for t in mcp_tools(memory_server())}
    assert create["schema_hash"] == schema_hash_of(tools["create_entities"]["inputSchema"])
    assert "input_schema" not in create  # an MCP upstream serves its own


def test_mcp_drafts_validate_and_lint_lists_exactly_their_todos() -> None:
    assert_lint_lists_exactly_the_todos(from_mcp(mcp_tools(memory_server()), URL, prefix="memory."))


@pytest.fixture
def served_memory() -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = memory_server().streamable_http_app(stateless_http=True, json_response=True)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert time.monotonic() < deadline, "the test MCP server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/mcp"
    server.should_exit = True
    thread.join(10)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_scaffold_from_a_live_mcp_server_writes_drafts_that_validate_and_lint_by_that_server(
        served_memory: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "manifests"
    code, printed, err = run(capsys, "manifests", "scaffold", "--from-mcp", served_memory,
                             "--prefix", "memory.", "--dir", str(out))
    assert code == 0, err
    assert "5 draft manifests" in printed
    assert sorted(p.name for p in out.iterdir()) == [
        "memory.create_entities.yaml", "memory.delete_entities.yaml", "memory.read_graph.yaml",
        "memory.send_summary.yaml", "memory.tag_entity.yaml"]
    assert run(capsys, "validate", str(out))[0] == 0
    # lint against the live server: every tool is found there (no L034, L035, L027), and
    # each TODO is listed
    code, printed, err = run(capsys, "lint", str(out), "--upstream-url", served_memory, "-o", "json")
    report = json.loads(printed)
    codes = [f["code"] for f in report["findings"]]
    assert not {"L034", "L035", "L027", "L017"} & set(codes), report
    texts = "".join(p.read_text() for p in out.iterdir())
    assert codes.count("L038") == texts.count("# TODO") > 0
    # a second run never overwrites
    code, _, err = run(capsys, "manifests", "scaffold", "--from-mcp", served_memory,
                       "--prefix", "memory.", "--dir", str(out))
    assert code == 1 and "already exist" in err and "nothing written" in err


def test_an_mcp_servers_list_does_not_make_rest_tools_warn(
        served_memory: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "rest.yaml").write_text(
        "tool: shop.get_order\neffect: read_only\npermission: shop:read\n"
        "upstream: {url: 'https://api.example.com/orders/{{args.id}}', method: GET}\n")
    code, printed, _ = run(capsys, "lint", str(tmp_path / "rest.yaml"), "--upstream-url",
                           served_memory, "-o", "json")
    assert code == 0
    assert [f["code"] for f in json.loads(printed)["findings"]] == ["L035"] * 5


def test_lint_says_when_an_upstream_url_cannot_be_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m.yaml").write_text("tool: a\neffect: read_only\npermission: p\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = run(capsys, "lint", str(tmp_path / "m.yaml"), "--upstream-url",
                       f"http://127.0.0.1:{port}/mcp")
    assert code == 1
    assert f"http://127.0.0.1:{port}/mcp: cannot read the MCP server's tools/list" in err


# ---- OpenAPI ---------------------------------------------------------------------------------

def test_effects_and_url_templates_come_from_the_openapi_document() -> None:
    drafts = from_openapi(OPENAPI, prefix="items.")
    m = by_tool(drafts)
    assert {t: (s["effect"], s["upstream"]["method"], s["upstream"]["url"]) for t, s in m.items()} == {
        "items.listItems": ("read_only", "GET", "https://api.example.com/v1/items"),
        "items.createItem": ("compensable", "POST", "https://api.example.com/v1/items"),
        "items.getItem": ("read_only", "GET", "https://api.example.com/v1/items/{{args.id}}"),
        "items.replaceItem": ("idempotent", "PUT", "https://api.example.com/v1/items/{{args.id}}"),
        "items.updateItem": ("irreversible", "PATCH", "https://api.example.com/v1/items/{{args.id}}"),
        "items.deleteItem": ("idempotent", "DELETE", "https://api.example.com/v1/items/{{args.id}}"),
        "items.createNote": ("irreversible", "POST", "https://api.example.com/v1/notes"),
    }
    create = m["items.createItem"]
    assert create["compensation"]["tool"] == "items.deleteItem"
    assert create["compensation"]["argument_map"] == {"id": "$result.id"}
    texts = {d.tool: d.text for d in drafts}
    assert "effect: compensable  # suggested from POST: it creates; review" in texts["items.createItem"]
    assert "TODO: add verification: {tool: items.getItem" in texts["items.createItem"]
    assert "TODO: name the tool that undoes this one" in texts["items.createNote"]
    expected = {"type": "object", "properties": {"name": {"type": "string"}, "tags": {
        "type": "array", "items": {"type": "string"}}}, "required": ["name"]}
    assert create["schema_hash"] == schema_hash_of(expected)
    assert create["input_schema"] == expected  # an HTTP tool's argument schema, served over MCP


def test_openapi_drafts_validate_and_lint_lists_exactly_their_todos() -> None:
    assert_lint_lists_exactly_the_todos(from_openapi(OPENAPI, prefix="items."))


def test_scaffold_from_an_openapi_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = {**OPENAPI, "servers": [{"url": "/relative"}]}
    (tmp_path / "api.json").write_text(json.dumps(doc))
    code, _, err = run(capsys, "manifests", "scaffold", "--from-openapi", str(tmp_path / "api.json"),
                       "--dir", str(tmp_path / "out"))
    assert code == 1 and "pass --base-url https://api.example.com" in err
    assert not (tmp_path / "out").exists()
    code, printed, err = run(capsys, "manifests", "scaffold", "--from-openapi",
                             str(tmp_path / "api.json"), "--base-url", "https://items.test",
                             "--dir", str(tmp_path / "out"), "-o", "json")
    assert code == 0, err
    report = json.loads(printed)
    assert len(report["written"]) == 7
    assert run(capsys, "validate", str(tmp_path / "out"))[0] == 0
    assert "https://items.test/items/{{args.id}}" in (tmp_path / "out" / "getItem.yaml").read_text()


def test_a_document_that_is_not_openapi_is_refused(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "x.yaml").write_text("name: not an api\n")
    code, _, err = run(capsys, "manifests", "scaffold", "--from-openapi", str(tmp_path / "x.yaml"))
    assert code == 1 and "not an OpenAPI document: it has no paths mapping" in err


def test_a_hostile_source_cannot_write_outside_the_folder_or_template_the_host() -> None:
    tools = [{"name": "../../etc/passwd", "inputSchema": {"type": "object"}}]
    (draft,) = from_mcp(tools, URL)
    assert "/" not in draft.filename and not draft.filename.startswith(".")
    doc = {"openapi": "3.0.3", "servers": [{"url": "https://api.example.com"}],
           "paths": {"x{host}": {"get": {"operationId": "get", "parameters": [
               {"name": "host", "in": "path", "required": True, "schema": {"type": "string"}}]}}}}
    (get,) = from_openapi(doc)
    assert yaml.safe_load(get.text)["upstream"]["url"] == "https://api.example.com/x{{args.host}}"
    checked([get])


def test_a_description_saying_todo_is_not_a_todo() -> None:
    tools = [{"name": "read_notes", "description": "Lists notes # TODO items too",
              "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}]
    drafts = from_mcp(tools, URL)
    assert "# TODO items too" in drafts[0].text
    result = checked(drafts)
    assert [src.todos for src in result.sources] == [[]]
