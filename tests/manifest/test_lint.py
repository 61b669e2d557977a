"""Lint: each L-code is triggered by exactly one change to a clean manifest set, at its
documented level, naming the tool and saying what to fix."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from unwind.manifest.lint import (
    RULES,
    Finding,
    lint,
    lint_report_json,
    lint_report_text,
    schema_hash_of,
)
from unwind.manifest.model import ToolManifest

Spec = dict[str, Any]

SCHEMAS: dict[str, dict[str, Any]] = {
    "shop.get_order": {"type": "object", "properties": {"order_id": {"type": "string"}},
                       "required": ["order_id"]},
    "shop.create_order": {"type": "object", "properties": {
        "cart_id": {"type": "string"}, "total": {"type": "integer"}, "card": {"type": "string"}},
        "required": ["cart_id", "total"]},
    "shop.cancel_order": {"type": "object", "properties": {"order_id": {"type": "string"}}},
    "mail.send_receipt": {"type": "object", "properties": {"to": {"type": "string"}}},
}


def clean_specs() -> dict[str, Spec]:
    """A set that triggers no finding at all, even against the upstream schemas."""
    specs: dict[str, Spec] = {
        "shop.get_order": {
            "tool": "shop.get_order", "effect": "read_only", "permission": "shop:read",
            "description": "Read an order."},
        "shop.create_order": {
            "tool": "shop.create_order", "effect": "compensable", "permission": "shop:write",
            "description": "Place an order.", "owner": ["shop-team"],
            "risk": {"data_class": "financial", "blast_radius": "medium"},
            "timeout_ms": "10s",
            "idempotency": {"key": "order-{{args.cart_id}}"},
            "audit": {"redaction": ["$args.card"]},
            "lookup": {"tool": "shop.get_order", "by": "idempotency_key",
                       "arguments": {"order_id": "$key"}},
            "compensation": {
                "tool": "shop.cancel_order",
                "residue": ["the customer gets an order and a cancellation e-mail"],
                "argument_map": {"order_id": "$result.id", "amount": "$args.total"},
                "verification": {"tool": "shop.get_order", "arguments": {"order_id": "$result.id"},
                                 "expect": {"status": "cancelled"}}}},
        "shop.cancel_order": {
            "tool": "shop.cancel_order", "effect": "idempotent", "permission": "shop:write",
            "description": "Cancel an order.", "owner": ["shop-team"],
            "risk": {"data_class": "financial"}, "timeout_ms": 5000},
        "mail.send_receipt": {
            "tool": "mail.send_receipt", "effect": "irreversible", "permission": "mail:send",
            "description": "E-mail a receipt.", "owner": ["shop-team"],
            "risk": {"data_class": "pii", "blast_radius": "low"}, "timeout_ms": "5s",
            "approval": {"roles": ["support"]},
            "audit": {"evidence_export": "required"}},
    }
    for name, spec in specs.items():
        spec["schema_hash"] = schema_hash_of(SCHEMAS[name])
    return specs


def models(specs: dict[str, Spec]) -> list[ToolManifest]:
    return [ToolManifest.model_validate(s) for s in specs.values()]


def lint_changed(change: Callable[[dict[str, Spec]], None],
                 schemas: dict[str, dict[str, Any]] | None = None) -> list[Finding]:
    specs = clean_specs()
    change(specs)
    return lint(models(specs), copy.deepcopy(SCHEMAS) if schemas is None else schemas)


def only(findings: list[Finding], code: str, level: str, tool: str) -> Finding:
    assert [(f.code, f.level, f.tool) for f in findings] == [(code, level, tool)], findings
    return findings[0]


def test_a_clean_manifest_set_triggers_no_code_with_or_without_upstream() -> None:
    assert lint(models(clean_specs())) == []
    assert lint(models(clean_specs()), SCHEMAS) == []


def test_the_rule_table_covers_every_targeted_code_once_in_order() -> None:
    codes = [r.code for r in RULES]
    assert codes == sorted(codes) == ["L010", "L011", "L012", "L013", "L014", "L015", "L016",
                                      "L017", "L019", "L020", "L021", "L022", "L023", "L024",
                                      "L027", "L030", "L031", "L032", "L033", "L034", "L035", "L036",
                                      "L037", "L038", "L039", "L040", "L041", "L042",
                                      "L043", "L044", "L045"]


def test_l010_a_mutating_tool_without_description_is_a_warning() -> None:
    f = only(lint_changed(lambda s: s["shop.cancel_order"].pop("description")),
             "L010", "warning", "shop.cancel_order")
    assert f.message.startswith("mutating tool has no description")
    assert "add description" in f.message


def test_l010_a_read_only_tool_may_go_without_description() -> None:
    assert lint_changed(lambda s: s["shop.get_order"].pop("description")) == []


def test_l011_a_mutating_tool_without_owner_is_a_warning() -> None:
    f = only(lint_changed(lambda s: s["shop.cancel_order"].pop("owner")),
             "L011", "warning", "shop.cancel_order")
    assert "nobody is named to ask when it misbehaves" in f.message
    assert "add owner" in f.message


def test_l012_a_mutating_tool_without_data_class_is_a_warning() -> None:
    f = only(lint_changed(lambda s: s["shop.create_order"]["risk"].pop("data_class")),
             "L012", "warning", "shop.create_order")
    assert f.message.startswith("no risk.data_class")
    assert "add risk: {data_class" in f.message


def test_l013_a_compensable_tool_without_residue_is_a_warning() -> None:
    f = only(lint_changed(lambda s: s["shop.create_order"]["compensation"].pop("residue")),
             "L013", "warning", "shop.create_order")
    assert "compensable but no residue declared" in f.message
    assert "compensation.residue" in f.message


def test_l014_a_compensation_tool_that_is_not_idempotent_is_a_warning() -> None:
    def change(s: dict[str, Spec]) -> None:
        s["shop.cancel_order"].update(effect="irreversible", approval={"roles": ["support"]},
                                      audit={"evidence_export": "required"},
                                      risk={"data_class": "financial", "blast_radius": "low"})
    f = only(lint_changed(change), "L014", "warning", "shop.create_order")
    assert "shop.cancel_order is irreversible, not idempotent" in f.message
    assert "rollback retries it" in f.message


def test_l015_irreversible_without_blast_radius_or_approvers_is_a_warning() -> None:
    def change(s: dict[str, Spec]) -> None:
        s["mail.send_receipt"].pop("approval")
        s["mail.send_receipt"]["risk"].pop("blast_radius")
    f = only(lint_changed(change), "L015", "warning", "mail.send_receipt")
    assert "irreversible with no blast_radius and no approvers" in f.message
    assert "risk.blast_radius and approval.roles" in f.message


def test_l015_approvers_alone_are_enough() -> None:
    assert lint_changed(lambda s: s["mail.send_receipt"]["risk"].pop("blast_radius")) == []


def test_l016_an_undo_without_verification_is_a_note() -> None:
    f = only(lint_changed(lambda s: s["shop.create_order"]["compensation"].pop("verification")),
             "L016", "info", "shop.create_order")
    assert "the undo is not verified" in f.message
    assert "add compensation.verification" in f.message


def test_l017_an_argument_map_reading_an_unknown_argument_is_an_error() -> None:
    def change(s: dict[str, Spec]) -> None:
        s["shop.create_order"]["compensation"]["argument_map"]["amount"] = "$args.totl.cents"
    f = only(lint_changed(change), "L017", "error", "shop.create_order")
    assert "compensation.argument_map.amount reads the argument 'totl'" in f.message
    assert "card, cart_id, total" in f.message
    assert "fix the reference" in f.message


def test_l017_a_verification_argument_reading_an_unknown_argument_is_an_error() -> None:
    def change(s: dict[str, Spec]) -> None:
        s["shop.create_order"]["compensation"]["verification"]["arguments"]["x"] = "$args.nope"
    f = only(lint_changed(change), "L017", "error", "shop.create_order")
    assert "compensation.verification.arguments.x reads the argument 'nope'" in f.message


def test_l017_an_opaque_upstream_schema_is_not_judged() -> None:
    def change(s: dict[str, Spec]) -> None:
        s["shop.create_order"]["compensation"]["argument_map"]["amount"] = "$args.nope"
    schemas = {**SCHEMAS, "shop.create_order": {"type": "object"}}
    findings = lint_changed(change, schemas)
    assert [f.code for f in findings] == ["L041"]  # open, but no argument is judged (no L017)


def test_l019_a_read_only_tool_sharing_a_write_permission_is_a_warning() -> None:
    f = only(lint_changed(lambda s: s["shop.get_order"].update(permission="shop:write")),
             "L019", "warning", "shop.get_order")
    assert "shares the permission shop:write" in f.message
    assert "(shop.cancel_order, shop.create_order)" in f.message
    assert "its own permission" in f.message


def test_l020_an_idempotency_key_using_an_unknown_argument_is_an_error() -> None:
    f = only(lint_changed(lambda s: s["shop.create_order"].update(
        idempotency={"key": "order-{{args.cart}}"})), "L020", "error", "shop.create_order")
    assert "idempotency.key uses the argument 'cart'" in f.message
    assert "fix the key template" in f.message


def test_l021_irreversible_without_required_evidence_export_is_a_note() -> None:
    f = only(lint_changed(lambda s: s["mail.send_receipt"].pop("audit")),
             "L021", "info", "mail.send_receipt")
    assert "audit.evidence_export: required" in f.message
    assert "set audit: {evidence_export: required}" in f.message


def test_l022_a_mutating_tool_without_timeout_is_a_note() -> None:
    f = only(lint_changed(lambda s: s["shop.cancel_order"].pop("timeout_ms")),
             "L022", "info", "shop.cancel_order")
    assert "a hung call is only bounded by the gateway default" in f.message
    assert "set timeout_ms" in f.message


def test_l023_a_requires_cycle_is_an_error() -> None:
    def change(s: dict[str, Spec]) -> None:
        s["shop.create_order"]["requires"] = ["shop.cancel_order"]
        s["shop.cancel_order"]["requires"] = ["shop.create_order"]
    f = only(lint_changed(change), "L023", "error", "shop.cancel_order")
    assert "(shop.cancel_order -> shop.create_order -> shop.cancel_order)" in f.message
    assert "remove one requirement" in f.message


def test_l024_a_draft_manifest_is_a_warning() -> None:
    f = only(lint_changed(lambda s: s["shop.get_order"].update(lifecycle="draft")),
             "L024", "warning", "shop.get_order")
    assert "draft manifest" in f.message
    assert "lifecycle: approved" in f.message


def test_l027_a_missing_schema_hash_is_a_note_that_gives_the_hash() -> None:
    f = only(lint_changed(lambda s: s["shop.get_order"].pop("schema_hash")),
             "L027", "info", "shop.get_order")
    assert f.message.startswith("no schema_hash")
    assert f"set schema_hash: {schema_hash_of(SCHEMAS['shop.get_order'])}" in f.message


def test_l030_reversible_with_residue_is_a_warning() -> None:
    f = only(lint_changed(lambda s: s["shop.create_order"].update(effect="reversible")),
             "L030", "warning", "shop.create_order")
    assert "declared reversible but the compensation lists residue" in f.message
    assert "set effect: compensable" in f.message


def test_l031_compensable_with_an_exact_inverse_is_a_warning() -> None:
    def change(s: dict[str, Spec]) -> None:
        s["shop.create_order"]["compensation"].pop("residue")
        s["shop.create_order"]["compensation"]["kind"] = "inverse"
    f = only(lint_changed(change), "L031", "warning", "shop.create_order")
    assert "declared compensable but the compensation is an exact inverse" in f.message
    assert "set effect: reversible" in f.message


def test_l032_a_compensation_built_only_from_constants_is_a_note() -> None:
    f = only(lint_changed(lambda s: s["shop.create_order"]["compensation"].update(
        argument_map={"order_id": {"const": "latest"}})), "L032", "info", "shop.create_order")
    assert "the compensation takes no arguments from the call" in f.message
    assert "compensation.argument_map" in f.message


def test_l033_a_redaction_path_naming_an_unknown_argument_is_a_warning() -> None:
    f = only(lint_changed(lambda s: s["shop.create_order"].update(
        audit={"redaction": ["$args.card_token", "$result.secret"]})),
        "L033", "warning", "shop.create_order")
    assert "audit.redaction[0] names the argument 'card_token'" in f.message
    assert "fix the path" in f.message


def test_l034_a_manifest_without_an_upstream_tool_is_a_warning() -> None:
    schemas = {k: v for k, v in SCHEMAS.items() if k != "shop.cancel_order"}
    f = only(lint_changed(lambda s: None, schemas), "L034", "warning", "shop.cancel_order")
    assert "no upstream tool is named shop.cancel_order" in f.message
    assert "fix the tool name or remove the manifest" in f.message


def test_l035_an_upstream_tool_without_a_manifest_is_a_warning() -> None:
    schemas = {**SCHEMAS, "shop.refund_order": {"type": "object", "properties": {}}}
    f = only(lint_changed(lambda s: None, schemas), "L035", "warning", "shop.refund_order")
    assert "no manifest declares it" in f.message
    assert "write a manifest for it" in f.message


def test_an_mcp_upstream_is_matched_by_the_mcp_tool_name() -> None:
    schemas = {("create_order" if k == "shop.create_order" else k): v for k, v in SCHEMAS.items()}
    findings = lint_changed(lambda s: s["shop.create_order"].update(
        upstream={"mcp": {"url": "http://mcp.local/mcp", "tool": "create_order"}}), schemas)
    assert findings == []


def test_upstream_codes_do_not_run_without_upstream_schemas() -> None:
    def change(s: dict[str, Spec]) -> None:
        for spec in s.values():
            spec.pop("schema_hash")
        s["shop.create_order"]["idempotency"]["key"] = "order-{{args.nope}}"
    assert lint_changed(change, schemas=None) != []  # sanity: with schemas it reports
    specs = clean_specs()
    change(specs)
    assert lint(models(specs)) == []


def test_findings_are_sorted_by_tool_then_code() -> None:
    def change(s: dict[str, Spec]) -> None:
        for name in ("shop.create_order", "mail.send_receipt"):
            s[name].pop("timeout_ms")
            s[name].pop("description")
    findings = lint_changed(change)
    assert [(f.tool, f.code) for f in findings] == [
        ("mail.send_receipt", "L010"), ("mail.send_receipt", "L022"),
        ("shop.create_order", "L010"), ("shop.create_order", "L022")]


def test_the_json_report_lists_findings_and_counts_info_as_notes() -> None:
    findings = [Finding("L023", "error", "a", "m1"), Finding("L011", "warning", "b", "m2"),
                Finding("L022", "info", "b", "m3")]
    assert lint_report_json(findings) == {
        "findings": [{"code": "L023", "level": "error", "tool": "a", "path": "", "message": "m1",
                      "file": None, "line": None},
                     {"code": "L011", "level": "warning", "tool": "b", "path": "", "message": "m2",
                      "file": None, "line": None},
                     {"code": "L022", "level": "info", "tool": "b", "path": "", "message": "m3",
                      "file": None, "line": None}],
        "errors": 1, "warnings": 1, "notes": 1, "silenced": []}


def test_the_text_report_reads_like_the_documentation() -> None:
    text = lint_report_text([Finding("L011", "warning", "stripe.refund", "m"),
                             Finding("L022", "info", "stripe.refund", "n")])
    assert text.splitlines() == ["warning L011  stripe.refund: m", "info    L022  stripe.refund: n",
                                 "0 errors, 1 warning, 1 note"]


def test_the_schema_hash_ignores_key_order_and_changes_with_the_schema() -> None:
    a = {"type": "object", "properties": {"x": {"type": "string"}, "y": {"type": "integer"}}}
    b = {"properties": {"y": {"type": "integer"}, "x": {"type": "string"}}, "type": "object"}
    assert schema_hash_of(a) == schema_hash_of(b)
    assert schema_hash_of(a).startswith("sha256:") and len(schema_hash_of(a)) == len("sha256:") + 16
    assert schema_hash_of(a) != schema_hash_of({**a, "required": ["x"]})


@pytest.mark.parametrize("path", ["manifests/payments.yaml"])
def test_the_example_payments_manifests_lint_clean(path: str) -> None:
    from pathlib import Path

    from unwind.manifest.loader import check_paths
    result = check_paths([Path(__file__).parents[2] / path])
    assert result.ok
    assert lint(result.manifests) == []


def test_l036_redacting_a_value_the_undo_needs_is_a_warning() -> None:
    def redact(s: dict[str, Any]) -> None:
        s["shop.create_order"]["audit"] = {"redaction": ["$result.id"]}  # the cancel reads $result.id
    f = only(lint_changed(redact), "L036", "warning", "shop.create_order")
    assert "compensation.argument_map" in f.message and "the undo of every call will be unavailable" in f.message


# ---- schemas matched per upstream (issue 19 #7) -------------------------------------------

MCP = "http://mcp.local/mcp"


def test_an_mcp_servers_list_does_not_make_rest_tools_warn_l034() -> None:
    specs = clean_specs()
    specs["shop.cancel_order"]["upstream"] = {"mcp": {"url": MCP, "tool": "cancel"}}
    server = {"cancel": SCHEMAS["shop.cancel_order"]}
    assert lint(models(specs), upstreams={MCP: server}) == []


def test_a_tool_missing_from_its_own_servers_list_is_l034_naming_the_server() -> None:
    specs = clean_specs()
    specs["shop.cancel_order"]["upstream"] = {"mcp": {"url": MCP, "tool": "cancel"}}
    found = lint(models(specs), upstreams={MCP: {"other": {"type": "object"}}})
    f = only([x for x in found if x.code != "L035"], "L034", "warning", "shop.cancel_order")
    assert f"no upstream tool at {MCP} is named cancel" in f.message


def test_a_servers_tool_without_a_manifest_is_l035_naming_the_server() -> None:
    specs = clean_specs()
    specs["shop.cancel_order"]["upstream"] = {"mcp": {"url": MCP, "tool": "cancel"}}
    server = {"cancel": SCHEMAS["shop.cancel_order"], "refund": {"type": "object"}}
    f = only(lint(models(specs), upstreams={MCP: server}), "L035", "warning", "refund")
    assert f"the upstream {MCP} offers this tool" in f.message


# ---- L037 mapping_type_mismatch (issue 19 #8) ----------------------------------------------

def _with_cancel_schema(props: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {**SCHEMAS, "shop.cancel_order": {"type": "object", "properties": props}}


def test_l037_a_scalar_mapped_where_the_target_wants_an_array_is_an_error() -> None:
    schemas = _with_cancel_schema({"order_id": {"type": "string"},
                                   "amount": {"type": "array", "items": {"type": "integer"}}})
    findings = lint_changed(lambda s: s["shop.create_order"].update(
        schema_hash=schema_hash_of(SCHEMAS["shop.create_order"])), schemas)
    f = only([x for x in findings if x.code != "L027"], "L037", "error", "shop.create_order")
    assert f.path == "compensation.argument_map.amount"
    assert "sends $args.total (integer), but shop.cancel_order takes amount as array" in f.message
    assert "projection such as $result.items[*].id" in f.message


def test_l037_an_integer_fits_a_number_and_undeclared_types_are_not_judged() -> None:
    schemas = _with_cancel_schema({"order_id": {}, "amount": {"type": "number"}})
    assert [f for f in lint_changed(lambda s: None, schemas) if f.code == "L037"] == []


def test_l037_a_literal_of_the_wrong_type_is_an_error() -> None:
    schemas = _with_cancel_schema({"order_id": {"type": "string"}, "amount": {"type": "integer"},
                                   "reason": {"type": "string"}})
    findings = lint_changed(lambda s: s["shop.create_order"]["compensation"]["argument_map"].update(
        reason={"const": 3}), schemas)
    f = only(findings, "L037", "error", "shop.create_order")
    assert "sends {const: 3} (integer), but shop.cancel_order takes reason as string" in f.message


def test_l037_a_projection_sent_where_the_target_wants_a_string_is_an_error() -> None:
    schemas = _with_cancel_schema({"order_id": {"type": "string"}})
    findings = lint_changed(lambda s: s["shop.create_order"]["compensation"]["argument_map"].update(
        order_id="$result.items[*].id"), schemas)
    f = only(findings, "L037", "error", "shop.create_order")
    assert "(array), but shop.cancel_order takes order_id as string" in f.message


# ---- L038 TODO comments ---------------------------------------------------------------------

def test_l038_each_todo_left_is_a_note_on_its_field() -> None:
    todos = {"shop.cancel_order": [("compensation", "how is this undone?")]}
    f = only(lint(models(clean_specs()), todos=todos), "L038", "info", "shop.cancel_order")
    assert f.path == "compensation"
    assert f.message.startswith("TODO left: how is this undone? (decide")


def test_a_servers_list_matches_its_url_with_or_without_a_trailing_slash() -> None:
    specs = clean_specs()
    specs["shop.cancel_order"]["upstream"] = {"mcp": {"url": MCP + "/", "tool": "cancel"}}
    assert lint(models(specs), upstreams={MCP: {"cancel": SCHEMAS["shop.cancel_order"]}}) == []


def test_l039_an_update_whose_undo_reads_no_before_is_a_warning() -> None:
    specs = clean_specs()
    specs["shop.create_order"]["upstream"] = {"url": "https://shop.example/orders/{{args.cart_id}}",
                                              "method": "PATCH"}
    f = only(lint(models(specs)), "L039", "warning", "shop.create_order")
    assert f.path == "compensation.argument_map"
    assert "reads no $before" in f.message
    specs["shop.create_order"]["capture"] = {"tool": "shop.get_order",
                                             "arguments": {"order_id": "$args.cart_id"}}
    specs["shop.create_order"]["compensation"]["argument_map"]["total"] = "$before.total"
    specs["shop.create_order"]["compensation"]["verification"]["after_call"] = True  # L043
    assert lint(models(specs)) == []


def test_l039_a_create_by_put_whose_undo_deletes_it_has_nothing_before_to_restore() -> None:
    # an API that refuses a PUT without the current revision: PUT /db/<id> only creates
    specs = clean_specs()
    specs["shop.create_order"]["upstream"] = {"url": "https://shop.example/orders/{{args.cart_id}}",
                                              "method": "PUT"}
    specs["shop.cancel_order"]["upstream"] = {"url": "https://shop.example/orders/{{args.order_id}}",
                                              "method": "DELETE"}
    assert lint(models(specs)) == []
    specs["shop.cancel_order"]["upstream"]["method"] = "POST"  # not a delete: it may overwrite
    only(lint(models(specs)), "L039", "warning", "shop.create_order")


def test_l040_an_idempotent_put_without_a_capture_is_a_warning() -> None:
    specs = clean_specs()
    specs["shop.cancel_order"]["upstream"] = {"url": "https://shop.example/orders/{{args.order_id}}",
                                              "method": "PUT"}
    f = only(lint(models(specs)), "L040", "warning", "shop.cancel_order")
    assert f.path == "effect" and "declare effect: reversible, capture:" in f.message
    specs["shop.cancel_order"]["upstream"]["method"] = "POST"
    assert lint(models(specs)) == []


def test_l034_a_flat_list_read_from_an_mcp_server_says_nothing_of_the_rest_tools() -> None:
    # issue 30: --upstream-schemas of a server's tools/list beside REST tools
    specs = clean_specs()
    specs["shop.cancel_order"]["upstream"] = {"mcp": {"url": MCP, "tool": "cancel"}}
    for name in ("shop.get_order", "shop.create_order", "mail.send_receipt"):
        specs[name]["upstream"] = {"url": f"https://shop.example/{name}"}
    flat = {"cancel": SCHEMAS["shop.cancel_order"]}
    assert [f.code for f in lint(models(specs), flat)] == []
    flat["shop.get_order"] = SCHEMAS["shop.get_order"]  # the list names a REST tool: judged
    found = [(f.code, f.tool) for f in lint(models(specs), flat) if f.code == "L034"]
    assert sorted(found) == [("L034", "mail.send_receipt"), ("L034", "shop.create_order")]


def test_l041_a_mutating_tool_whose_input_schema_admits_fields_nobody_named_is_a_warning() -> None:
    specs = clean_specs()
    specs["shop.cancel_order"]["input_schema"] = {
        "type": "object", "properties": {"order_id": {"type": "string"},
                                         "note": {"type": "object"}}}  # a free-form object
    f = only(lint(models(specs)), "L041", "warning", "shop.cancel_order")
    assert f.path == "input_schema"
    assert f.message.startswith("input_schema.properties.note: an object with no properties listed")
    assert "set additionalProperties: false" in f.message
    specs["shop.cancel_order"]["input_schema"] = {
        "type": "object", "properties": {"order_id": {"type": "string"}},
        "additionalProperties": True}
    f = only(lint(models(specs)), "L041", "warning", "shop.cancel_order")
    assert "additionalProperties admits arguments the schema does not name" in f.message
    specs["shop.cancel_order"]["input_schema"]["additionalProperties"] = False
    assert lint(models(specs)) == []
    specs["shop.get_order"]["input_schema"] = {"type": "object"}  # read_only: not judged
    assert lint(models(specs)) == []


def test_l042_an_undo_that_projects_the_calls_own_arguments_is_a_warning() -> None:
    specs = clean_specs()
    specs["shop.create_order"]["compensation"]["argument_map"]["order_id"] = "$args.orders[*].id"
    f = only(lint(models(specs)), "L042", "warning", "shop.create_order")
    assert f.path == "compensation.argument_map.order_id"
    assert "undoes what the call named, not what it made" in f.message
    assert "$result[*]" in f.message
    specs["shop.create_order"]["compensation"]["argument_map"]["order_id"] = "$result.orders[*].id"
    assert lint(models(specs)) == []


def test_l043_a_capture_checked_against_the_calls_answer_is_a_warning() -> None:
    specs = clean_specs()
    order = specs["shop.create_order"]
    order["capture"] = {"tool": "shop.get_order", "arguments": {"order_id": "$args.cart_id"}}
    f = only(lint(models(specs)), "L043", "warning", "shop.create_order")
    assert f.path == "compensation.verification.after_call"
    assert "compares the state it reads with the call's answer" in f.message
    assert "set verification.after_call: true" in f.message
    order["compensation"]["verification"]["after_call"] = True
    assert lint(models(specs)) == []


def test_l044_a_run_scoped_key_carried_in_an_argument_is_a_warning() -> None:
    specs = clean_specs()
    specs["shop.create_order"]["idempotency"]["carrier"] = {"argument": "cart_id"}
    f = only(lint(models(specs)), "L044", "warning", "shop.create_order")
    assert f.path == "idempotency.carrier.argument"
    assert "every run sends the same key" in f.message
    specs["shop.create_order"]["idempotency"]["carrier"] = {"header": "Idempotency-Key"}
    assert lint(models(specs)) == []  # a header carries <run>:<key>


def test_l045_an_undoable_tool_without_a_lookup_is_a_note() -> None:
    specs = clean_specs()
    specs["shop.create_order"].pop("lookup")
    specs["shop.create_order"]["upstream"] = {"url": "https://shop.example/orders"}
    f = only(lint(models(specs)), "L045", "info", "shop.create_order")
    assert f.path == "lookup"
    assert "when its answer is lost" in f.message and "unrecoverable" in f.message
