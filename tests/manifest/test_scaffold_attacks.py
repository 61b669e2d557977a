"""Issue 29, items 1 and 9: a hostile source cannot make `unwind manifests scaffold` write
anything but drafts, nor make it work without end.

Each draft must read back, with a YAML 1.1 reader (PyYAML: unwind's loader, and what
Kubernetes' tooling does) and a YAML 1.2 reader (ruamel) alike, as exactly one document:
the draft meant, ``lifecycle: draft``. Before, a tool name holding ``\\r---\\r`` planted a
second, approved manifest through the draft's first comment."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from unwind.cli.main import main
from unwind.manifest.loader import check, load_text
from unwind.manifest.scaffold import Draft, from_mcp, from_openapi

ROOT = Path(__file__).resolve().parents[2]
URL = "http://127.0.0.1:9/mcp"
PLANT = "\r---\rtool: mail.send\reffect: read_only\rpermission: mail:read\rlifecycle: approved\r"
BREAKS = ("\r", "\x85", "\u2028", "\u2029", "\x0b", "\x0c", "\x1b[2J", "\x00", "\ufeff", "\u202e")


def documents(text: str) -> tuple[list[Any], list[Any]]:
    """What a YAML 1.1 and a YAML 1.2 reader find in ``text``."""
    return (list(yaml.safe_load_all(text)),
            list(YAML(typ="safe", pure=True).load_all(text)))


def assert_only_the_draft(d: Draft) -> None:
    old, new = documents(d.text)
    assert len(old) == 1 and len(new) == 1, d.text
    assert old[0] == new[0], d.text
    assert old[0]["lifecycle"] == "draft" and old[0]["tool"] == d.tool
    for ch in ("\r", "\x85", "\u2028", "\u2029"):
        assert ch not in d.text


def test_a_tool_name_holding_carriage_returns_cannot_plant_an_approved_manifest() -> None:
    tools = [{"name": "notes_read" + PLANT, "inputSchema": {"type": "object"},
              "annotations": {"readOnlyHint": True}},
             {"name": "notes_list", "description": "Lists notes" + PLANT,
              "inputSchema": {"type": "object", "properties": {"q" + PLANT: {"type": "string"}}},
              "annotations": {"readOnlyHint": True}}]
    drafts = from_mcp(tools, URL + PLANT)
    for d in drafts:
        assert_only_the_draft(d)
    assert [d.tool for d in drafts] == ["notes_list"]  # the bad name is refused, not changed
    skipped: list[str] = []
    from_mcp(tools, URL, skipped=skipped)
    assert len(skipped) == 1 and "is not a tool name" in skipped[0]
    assert "notes_read\\x0d---\\x0dtool" in skipped[0]  # named, escaped
    data = yaml.safe_load(drafts[0].text)
    assert data["description"] == ("Lists notes" + PLANT).strip()  # faithful: one quoted value
    assert data["upstream"]["mcp"]["url"] == URL + PLANT
    result = check(load_text(drafts[0].text, "d.yaml"))
    assert [m.lifecycle for m in result.manifests] == ["draft"]


@pytest.mark.parametrize("brk", BREAKS)
def test_a_line_break_of_any_yaml_reader_in_any_source_text_stays_inside_one_value(brk: str) -> None:
    plant = PLANT.replace("\r", brk)
    tools = [{"name": "make_note", "description": "Make" + plant,
              "inputSchema": {"type": "object", "properties": {
                  "text" + plant: {"type": "string", "description": plant,
                                   "enum": ["yes", "no", "on", plant]}}},
              "annotations": {"destructiveHint": False}}]
    (d,) = from_mcp(tools, URL + plant)
    assert_only_the_draft(d)
    doc = openapi_with(plant)
    for d in from_openapi(doc, prefix="x."):
        assert_only_the_draft(d)


def test_words_a_yaml_1_1_reader_takes_for_booleans_stay_strings() -> None:
    tools = [{"name": "set_flag", "description": "yes",
              "inputSchema": {"type": "object", "properties": {
                  "on": {"type": "string", "enum": ["yes", "no", "off", "y", "1_000", "1:20"]}}},
              "annotations": {"destructiveHint": False, "idempotentHint": True}}]
    (d,) = from_mcp(tools, URL)
    data = yaml.safe_load(d.text)  # as kubectl's YAML 1.1 reads it
    assert data["description"] == "yes"


def openapi_with(text: str) -> dict[str, Any]:
    return {"openapi": "3.0.3", "servers": [{"url": "https://api.example.com"}],
            "components": {"schemas": {"Note" + text: {"type": "object", "properties": {
                "body" + text: {"type": "string", "description": text}}}}},
            "paths": {"/notes" + text: {"post": {
                "operationId": "createNote" + text, "summary": text,
                "requestBody": {"content": {"application/json": {"schema": {
                    "type": "object", "properties": {"note": {
                        "$ref": "#/components/schemas/Note" + text.replace("~", "~0").replace("/", "~1")}}}}}}}}}}


HOSTILE = st.text(alphabet=st.sampled_from(list("ab-_:./ #'\"\\{}[],&*!|>%@`~") + list("".join(BREAKS))
                                           + ["\n", "\t", "é", "\u2066", "\U0001f600"]),
                  max_size=24)


@settings(max_examples=150)
@given(name=HOSTILE, description=HOSTILE, key=HOSTILE, value=HOSTILE, url=HOSTILE)
def test_whatever_an_mcp_server_says_each_draft_reads_back_as_itself(
        name: str, description: str, key: str, value: str, url: str) -> None:
    tools = [{"name": name, "description": description,
              "inputSchema": {"type": "object", "properties": {key: {"type": "string",
                                                                     "description": value}},
                              "required": [key]},
              "annotations": {"destructiveHint": False}},
             {"name": "delete_" + name, "inputSchema": {"type": "object",
                                                         "properties": {value: {}}}}]
    for d in from_mcp(tools, URL + url, prefix=value[:4]):
        assert_only_the_draft(d)
        assert yaml.safe_load(d.text)["upstream"]["mcp"]["url"] == URL + url


@settings(max_examples=100)
@given(path=HOSTILE, op=HOSTILE, text=HOSTILE)
def test_whatever_an_openapi_document_says_each_draft_reads_back_as_itself(
        path: str, op: str, text: str) -> None:
    doc = {"openapi": "3.0.3", "servers": [{"url": "https://api.example.com"}],
           "paths": {"/items" + path: {"post": {"operationId": op or "x", "summary": text,
                                               "parameters": [{"name": text or "q", "in": "query",
                                                               "schema": {"type": "string"}}]}}}}
    for d in from_openapi(doc):
        assert_only_the_draft(d)


def test_a_written_draft_that_does_not_read_back_as_meant_is_never_left_in_place(
        tmp_path: Path) -> None:
    from unwind.cli.check_cmds import _Stop
    from unwind.cli.scaffold_cmds import write_drafts

    tools = [{"name": "read_a", "inputSchema": {"type": "object"},
              "annotations": {"readOnlyHint": True}},
             {"name": "read_b", "inputSchema": {"type": "object"},
              "annotations": {"readOnlyHint": True}}]
    good, bad = from_mcp(tools, URL)
    bad.data = {**bad.data, "lifecycle": "approved"}  # what the text holds is not what is meant
    with pytest.raises(_Stop, match="read back"):
        write_drafts(tmp_path / "out", [good, bad])
    assert list((tmp_path / "out").iterdir()) == []  # not the good one either
    assert [p.name for p in write_drafts(tmp_path / "out", [good])] == ["read_a.yaml"]


# ---- item 9: $ref fan-out in an OpenAPI document -----------------------------------------

def fan_out(levels: int, width: int = 2) -> dict[str, Any]:
    """Components that each name the one below ``width`` times: width^levels copies when
    inlined."""
    schemas: dict[str, Any] = {"S0": {"type": "string"}}
    for i in range(1, levels + 1):
        below = {"$ref": f"#/components/schemas/S{i - 1}"}
        schemas[f"S{i}"] = {"properties": {chr(97 + k): below for k in range(width)}}
    return {"openapi": "3.0.3", "info": {"title": "fan", "version": "1"},
            "servers": [{"url": "https://api.example.com"}],
            "components": {"schemas": schemas},
            "paths": {"/things": {"post": {"operationId": "createThing", "requestBody": {
                "content": {"application/json": {"schema": {
                    "$ref": f"#/components/schemas/S{levels}"}}}}}}}}


def test_references_that_fan_out_are_kept_as_defs_not_copied() -> None:
    (d,) = from_openapi(fan_out(14))  # inlined: 2^14 copies of S0, some 600 KiB
    assert len(d.text) < 8 * 1024, len(d.text)
    schema = yaml.safe_load(d.text).get("input_schema")
    if schema is not None:  # kept: every component once, by reference
        assert set(schema["$defs"]) == {f"S{i}" for i in range(14)}
        assert schema["properties"]["a"] == {"$ref": "#/$defs/S13"}  # pragma: no cover
    else:  # or left out, saying why
        assert any("input schema is left out" in n and "expand" in n for n in d.notes), d.notes
    result = check(load_text(d.text, "d.yaml"))
    assert result.issues == []


def test_the_issues_26_kib_openapi_document_scaffolds_in_bounded_time_and_memory(
        tmp_path: Path) -> None:
    doc = fan_out(10, 6)  # 6^10 copies inlined
    path = tmp_path / "fan.json"
    path.write_text(json.dumps(doc, separators=(",", ":")))
    assert 2.5 * 1024 < path.stat().st_size < 2.9 * 1024  # about the issue's 2.6 KiB

    def limit() -> None:  # 52 s and 700 MiB before: the child is cut off well before that
        resource.setrlimit(resource.RLIMIT_AS, (1024 * 1024 * 1024, 1024 * 1024 * 1024))
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'operator'}:{ROOT}"}
    done = subprocess.run([sys.executable, "-m", "unwind.cli.main", "manifests", "scaffold",
                           "--from-openapi", str(path), "--dir", str(tmp_path / "out"),
                           "-o", "json"], capture_output=True, text=True, timeout=30,
                          preexec_fn=limit, env=env)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    (tool,) = report["tools"]
    assert any("input schema is left out" in n for n in tool["notes"]), tool["notes"]
    assert (tmp_path / "out" / "createThing.yaml").stat().st_size < 4 * 1024


def test_yaml_aliases_that_repeat_a_node_cannot_make_the_copy_explode(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = ["openapi: 3.0.3", "servers: [{url: 'https://api.example.com'}]",
             "x0: &a0 {type: string}"]
    for i in range(1, 40):
        lines.append(f"x{i}: &a{i} {{type: object, properties: {{a: *a{i - 1}, b: *a{i - 1}}}}}")
    lines += ["paths:", "  /t:", "    post:", "      operationId: t", "      requestBody:",
              "        content:", "          application/json:", "            schema: *a39"]
    (tmp_path / "api.yaml").write_text("\n".join(lines) + "\n")
    code = main(["manifests", "scaffold", "--from-openapi", str(tmp_path / "api.yaml"),
                 "--dir", str(tmp_path / "out")])
    _, err = capsys.readouterr()
    assert code == 1 and "copy to more than" in err
    assert not (tmp_path / "out").exists()
