"""Issue 30, item 3: `unwind manifests scaffold --from-mcp -- CMD ARGS` adopts a stdio MCP
server, against a published one nobody here wrote (``@modelcontextprotocol/server-memory``
from npm, pinned; ``scripts/install.sh`` installs it, the fixture finds it in the cache).

The worked example of docs/manifests.md ("A worked example: a stdio MCP server") is run here
command by command, as written, with three substitutions a reader's machine does not need:
the installed server's path for ``npx -y @modelcontextprotocol/server-memory`` (CI does not
fetch at test time), this test's folder for the graph's file, and a free port."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from unwind.cli.main import main

from .conftest import ROOT, free_port
from .installs import SERVER_MEMORY, npm_tool

SECTION = "### A worked example: a stdio MCP server (server-memory)"
NPX = "npx -y @modelcontextprotocol/server-memory"
NPX_ARGV = 'npx, -y, "@modelcontextprotocol/server-memory"'


@pytest.fixture(scope="module")
def server_memory() -> Path:
    return npm_tool(*SERVER_MEMORY, "mcp-server-memory")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_scaffold_reads_a_stdio_server_by_its_command_and_every_draft_names_that_command(
        server_memory: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "manifests", "scaffold", "--prefix", "memory.", "--dir",
                         str(tmp_path / "out"), "--from-mcp", "--", str(server_memory))
    assert code == 0, err
    assert "9 draft manifests" in out
    drafts = {p.name: yaml.safe_load(p.read_text()) for p in (tmp_path / "out").iterdir()}
    assert len(drafts) == 9
    for data in drafts.values():
        assert data["upstream"]["mcp"]["command"] == [str(server_memory)]
        assert data["lifecycle"] == "draft"
    assert drafts["memory.read_graph.yaml"]["effect"] == "read_only"  # readOnlyHint
    assert run(capsys, "validate", str(tmp_path / "out"))[0] == 0


@pytest.mark.parametrize("given", ["npx -y @modelcontextprotocol/server-memory", "server-memory",
                                   "ftp://example.com/mcp"])
def test_an_argument_that_is_neither_a_url_nor_a_command_says_which_forms_are_accepted(
        given: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "manifests", "scaffold", "--dir", str(tmp_path / "out"),
                       "--from-mcp", given)
    assert code == 1
    assert f"--from-mcp: {given!r} is neither an http(s) URL nor a command" in err
    assert "--from-mcp http://127.0.0.1:3000/mcp" in err and "--from-mcp -- npx -y" in err
    assert not (tmp_path / "out").exists()


def section() -> str:
    text = (ROOT / "docs" / "manifests.md").read_text()
    assert text.count(SECTION) == 1
    body = text.split(SECTION, 1)[1]
    return re.split(r"\n##? ", body, maxsplit=1)[0]


def blocks(text: str, fence: str) -> list[str]:
    return re.findall(rf"```{fence}\n(.*?)```", text, flags=re.S)


def test_the_worked_example_of_a_stdio_server_adopted_with_the_scaffold_runs_as_written(
        server_memory: Path, tmp_path: Path) -> None:
    store = tmp_path / "memory.jsonl"
    port = str(free_port())

    def local(text: str) -> str:
        return (text.replace(NPX, str(server_memory)).replace(NPX_ARGV, f'"{server_memory}"')
                .replace("/tmp/unwind-memory.jsonl", str(store)).replace("8797", port))
    docs = section()
    scaffold, remove, story = (local(b) for b in blocks(docs, "sh"))
    (reviewed,) = (local(b) for b in blocks(docs, "yaml"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": f"{ROOT / 'operator'}{os.pathsep}{ROOT}"}

    def bash(script: str) -> str:
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            out, _ = proc.communicate(timeout=240)
        finally:
            with contextlib.suppress(ProcessLookupError):  # what the block left behind
                os.killpg(proc.pid, signal.SIGTERM)
        assert proc.returncode == 0, out
        return out

    out = bash(scaffold)
    assert "9 draft manifests" in out and "ok: 9 tool manifests valid" in out
    assert "L038" in out  # lint lists what is left to decide
    bash(remove)
    (tmp_path / "memory" / "reviewed.yaml").write_text(reviewed)
    out = bash(story)
    assert "ok: 9 tool manifests valid" in out
    plan = json.loads(out[out.index('{\n  "ledger"'):out.index("\n}\n") + 2])
    assert [(s["action"], s["undo_tool"], s["arguments"]) for s in plan["steps"]] == [
        ("inverse", "memory.delete_entities", {"entityNames": ["unwind"]})]  # what it created
    assert "read it back as expected" in out and "rolled back: 1 step ran" in out
    final = out.strip().splitlines()[-1]
    assert '"gateway"' in final and '"unwind"' not in final, final
    names = {line.split('"name":"')[1].split('"')[0] for line in store.read_text().splitlines()
             if '"type":"entity"' in line}
    assert names == {"gateway"}  # read from the server's own file
