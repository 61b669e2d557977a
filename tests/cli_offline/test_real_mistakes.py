"""Mistakes people make writing manifests for real APIs, caught before anything runs
(issue 19 #8): each names the field and says what to write instead."""

from __future__ import annotations

from pathlib import Path

from .conftest import Run

HEAD = "tool: shop.create_order\neffect: compensable\npermission: shop:write\n"


def test_an_unquoted_indexed_reference_in_a_flow_mapping_is_told_to_be_quoted(
        project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(
        HEAD + "compensation: {tool: shop.cancel_order, argument_map: {id: $result.items[0].id}}\n")
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1
    assert "m.yaml:4: YAML syntax error: the reference $result.items[0].id is unquoted" in err
    assert 'quote it (id: "$result.items[0].id")' in err


def test_a_single_brace_url_placeholder_is_refused_with_the_double_brace_form(
        project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(
        "tool: shop.get_order\neffect: read_only\npermission: shop:read\n"
        "upstream: {url: 'https://api.example.com/orders/{id}', method: GET}\n")
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1
    assert "m.yaml:4: shop.get_order: upstream.url: {id} is not a placeholder" in err
    assert "write {{args.id}}" in err


def test_an_unknown_mcp_field_is_not_sent_under_an_unrelated_block(
        project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(
        "tool: mem.read\neffect: read_only\npermission: mem:read\n"
        "upstream:\n  mcp:\n    url: http://127.0.0.1:9/mcp\n    tool: read_graph\n    name: memory\n")
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1
    assert "m.yaml:8: mem.read: upstream.mcp.name: unknown field 'name'" in err
    assert "belongs under" not in err
