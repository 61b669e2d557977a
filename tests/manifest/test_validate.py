"""Every validator rule, each fed a manifest that breaks exactly that rule."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from unwind.manifest.validate import MANIFEST_RULES, SET_RULES, validate_manifest, validate_set

BASE: dict[str, Any] = {
    "tool": "shop.create_order",
    "effect": "compensable",
    "permission": "shop:write",
    "idempotency": {"key": "order-{{args.order_id}}"},
    "compensation": {
        "tool": "shop.cancel_order",
        "argument_map": {"order_id": "$result.id", "reason": {"const": "rollback"}},
        "verification": {"tool": "shop.get_order", "arguments": {"order_id": "$result.id"},
                         "expect": {"state": "cancelled"}},
    },
}
READ = {"tool": "shop.get_order", "effect": "read_only", "permission": "shop:read"}
CANCEL = {"tool": "shop.cancel_order", "effect": "idempotent", "permission": "shop:write"}


def with_(**changes: Any) -> dict[str, Any]:
    """BASE with dotted-path changes; a value of DELETE removes the field."""
    data = copy.deepcopy(BASE)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = data
        for p in parents:
            node = node.setdefault(p, {})
        if value is DELETE:
            node.pop(last, None)
        else:
            node[last] = value
    return data


DELETE = object()


def issues_of(data: dict[str, Any]) -> list[tuple[str, str]]:
    _, issues = validate_manifest(data)
    return [(i.path, i.message) for i in issues]


def test_the_base_manifest_is_valid() -> None:
    assert issues_of(BASE) == []


CASES = [
    ("tool names longer than 128 characters are refused", with_(tool="a" * 129),
     "tool", "is 129 characters long; the limit is 128"),
    ("tool names with spaces are refused", with_(tool="create order"),
     "tool", "is not a valid tool name"),
    ("a permission with whitespace is refused", with_(permission="shop write"),
     "permission", "no whitespace"),
    ("a compensable tool without a compensation is refused", with_(compensation=DELETE),
     "compensation", "must declare how it is undone"),
    ("a read-only tool with a compensation is refused", with_(effect="read_only"),
     "compensation", "has nothing to undo"),
    ("an irreversible tool cannot set approval never",
     with_(effect="irreversible", compensation=DELETE, approval="never"),
     "approval", "cannot set approval: never"),
    ("a tool undoes itself only as its own exact inverse",
     with_(compensation__tool="shop.create_order"),
     "compensation.tool", "undoes itself only as its own exact inverse"),
    ("a tool that undoes itself with the same arguments would repeat its effect",
     with_(effect="reversible", compensation__kind="inverse",
           compensation__tool="shop.create_order",
           compensation__argument_map={"order_id": "$args.order_id"}),
     "compensation.tool", "would call the tool again with the same arguments"),
    ("a tool that undoes itself to the state the agent claimed is refused (mail.move back to "
     "the folder the call said it came from)",
     with_(effect="reversible", compensation__kind="inverse", compensation__tool="shop.create_order",
           compensation__argument_map={"id": "$args.id", "from": "$args.to", "to": "$args.from"},
           compensation__verification__expect={"folder": "$before.folder"},
           capture={"tool": "shop.get_order", "arguments": {"id": "$args.id"}}),
     "compensation.argument_map", "the prior state it puts back is what the agent claimed"),
    ("a tool that undoes itself is not read back against the state the agent claimed",
     with_(effect="reversible", compensation__kind="inverse", compensation__tool="shop.create_order",
           compensation__argument_map={"id": "$args.id", "from": "$args.to",
                                       "to": "$before.folder"},
           compensation__verification__expect={"folder": "$args.from"},
           capture={"tool": "shop.get_order", "arguments": {"id": "$args.id"}}),
     "compensation.verification.expect.folder", "a read-back of the claim confirms the claim"),
    ("a tool cannot require itself", with_(requires=["shop.create_order"]),
     "requires[0]", "cannot require itself"),
    ("requires has no duplicates", with_(requires=["shop.get_order", {"tool": "shop.get_order"}]),
     "requires[1]", "is listed twice"),
    ("a malformed projection is refused with how to write one",
     with_(compensation__argument_map={"order_id": "$result.id", "ids": "$result.items[*"}),
     "compensation.argument_map.ids", "every item of a list [*]"),
    ("a doubled star is refused",
     with_(compensation__argument_map={"order_id": "$result.id", "ids": "$result.items[**].id"}),
     "compensation.argument_map.ids", "every item of a list [*]"),
    ("a nested projection is refused",
     with_(compensation__verification__arguments={"ids": "$result.a[*].b[*].id"}),
     "compensation.verification.arguments.ids", "at most one [*]"),
    ("an argument_map entry must be a reference",
     with_(compensation__argument_map={"order_id": "result.id"}),
     "compensation.argument_map.order_id", "is not a reference"),
    ("a verification argument must be a reference",
     with_(compensation__verification__arguments={"order_id": "$result.id[x]"}),
     "compensation.verification.arguments.order_id", "an index is written [n]"),
    ("a redaction entry must be a reference", with_(audit={"redaction": ["card_token"]}),
     "audit.redaction[0]", "is not a reference"),
    ("an undo argument cannot read the idempotency key",
     with_(compensation__argument_map={"k": "$key"}),
     "compensation.argument_map.k", "an undo argument cannot read $key"),
    ("an undo reading $before needs a capture",
     with_(compensation__argument_map={"order_id": "$result.id", "email": "$before.email"}),
     "compensation.argument_map.email", "the manifest declares no capture"),
    ("a capture on a tool without an undo is refused",
     with_(effect="read_only", compensation=DELETE, capture={"tool": "shop.get_order"}),
     "capture", "has no undo to read the captured state"),
    ("a capture argument cannot read the call's answer (there is none yet)",
     with_(capture={"tool": "shop.get_order", "arguments": {"id": "$result.id"}}),
     "capture.arguments.id", "a capture argument (it runs before the call, which has no "
     "answer yet) cannot read $result"),
    ("a lookup cannot read the captured state",
     with_(capture={"tool": "shop.get_order", "arguments": {"id": "$args.order_id"}},
           lookup={"tool": "shop.get_order", "by": "id", "arguments": {"id": "$before.id"}}),
     "lookup.arguments.id", "a lookup by id cannot read $before (the captured state)"),
    ("an inverse cannot list residue",
     with_(effect="reversible", compensation__kind="inverse", compensation__residue=["a trace"]),
     "compensation.residue", "cannot leave residue"),
    ("a deadline has exactly one form",
     with_(effect="reversible", compensation__kind="inverse",
           compensation__deadline={"within_ms": "1h", "at": "$result.expires_at"}),
     "compensation.deadline", "give exactly one of within_ms or at"),
    ("a deadline only bounds an inverse of a reversible tool",
     with_(compensation__deadline={"within_ms": "1h"}),
     "compensation.deadline", "only on a reversible tool"),
    ("a deadline at reads the result",
     with_(effect="reversible", compensation__kind="inverse",
           compensation__deadline={"at": "$args.expires_at"}),
     "compensation.deadline.at", "deadline.at cannot read $args"),
    ("retry is refused on a compensable tool", with_(retry={"attempts": 2}),
     "retry", "could repeat its effect"),
    ("verification.expect cannot be empty", with_(compensation__verification__expect={}),
     "compensation.verification.expect", "is empty"),
    ("an expect key that does not parse is refused",
     with_(compensation__verification__expect={"state..name": "cancelled"}),
     "compensation.verification.expect.state..name", "is not a path in the read-back's answer"),
    ("an expect key names one value, never a projection",
     with_(compensation__verification__expect={"items[*].state": "cancelled"}),
     "compensation.verification.expect.items[*].state", "has no [*]"),
    ("an expected value written as a reference must parse",
     with_(compensation__verification__expect={"state": "$arg.state"}),
     "compensation.verification.expect.state", "write {const: '$arg.state'}"),
    ("an expected value cannot read the idempotency key",
     with_(compensation__verification__expect={"state": "$key"}),
     "compensation.verification.expect.state", "an expected value cannot read $key"),
    ("an expected value is never optional",
     with_(compensation__verification__expect={"state": "$args.state?"}),
     "compensation.verification.expect.state", "is never optional"),
    ("a deadline is one time, never a projection",
     with_(effect="reversible", compensation__kind="inverse",
           compensation__deadline={"at": "$result.holds[*].until"}),
     "compensation.deadline.at", "the deadline is one time"),
    ("a quorum above 10 is refused", with_(approval={"roles": ["a"], "quorum": 11}),
     "approval.quorum", "between 1 and 10"),
    ("a quorum above 1 needs roles", with_(approval={"quorum": 2}),
     "approval.quorum", "needs roles"),
    ("escalation needs someone to escalate to", with_(approval={"on_timeout": "escalate"}),
     "approval.escalate_to", "needs escalate_to"),
    ("an idempotency key template needs an argument", with_(idempotency={"key": "order"}),
     "idempotency.key", "at least one {{args.<field>}}"),
    ("an idempotency key placeholder must name an argument",
     with_(idempotency={"key": "order-{{args.id}}-{{result.id}}"}),
     "idempotency.key", "placeholder {{result.id}} is not a call argument"),
    ("an idempotency key is one plain value, never a projection",
     with_(idempotency={"key": "order-{{args.id}}-{{args.items[*].sku}}"}),
     "idempotency.key", "a key is one plain value"),
    ("an idempotency carrier names exactly one place",
     with_(idempotency={"key": "o-{{args.id}}", "carrier": {"header": "Idempotency-Key",
                                                           "argument": "key"}}),
     "idempotency.carrier", "give exactly one of header or argument"),
    ("an idempotency carrier header is a header name",
     with_(idempotency={"key": "o-{{args.id}}", "carrier": {"header": "Idempotency Key"}}),
     "idempotency.carrier.header", "is not an HTTP header name"),
    ("an idempotency key read from a redacted argument is refused (it would be stored in clear)",
     with_(audit={"redaction": ["$args.order_id"]}),
     "idempotency.key", "key on a non-secret argument that identifies the call (an order id), "
     "or drop the redaction"),
    ("a lookup by idempotency key needs an idempotency declaration",
     with_(idempotency=DELETE, lookup={"tool": "shop.get_order", "by": "idempotency_key",
                                       "arguments": {"id": "$args.order_id"}}),
     "lookup.by", "needs an idempotency declaration"),
    ("only a lookup by key may read the key",
     with_(lookup={"tool": "shop.get_order", "by": "id", "arguments": {"k": "$key"}}),
     "lookup.arguments.k", "a lookup by id cannot read $key"),
    ("a lookup by key cannot read the result it replaces",
     with_(lookup={"tool": "shop.get_order", "by": "idempotency_key",
                   "arguments": {"id": "$result.id"}}),
     "lookup.arguments.id", "a lookup by idempotency key cannot read $result"),
    ("a draft reads only the call's arguments",
     with_(draft={"tool": "shop.create_order", "arguments": {"id": "$result.id"},
                  "promote": "shop.get_order"}),
     "draft.arguments.id", "a draft argument cannot read $result"),
    ("replaced_by is only for a deprecated tool", with_(replaced_by="shop.get_order"),
     "replaced_by", "only a deprecated tool names a replacement"),
    ("an upstream names exactly one target", with_(upstream={"method": "POST"}),
     "upstream", "give exactly one of url or mcp"),
    ("an MCP upstream names a URL or a command, not both",
     with_(upstream={"mcp": {"url": "http://127.0.0.1:9/mcp", "command": ["srv"], "tool": "t"}}),
     "upstream.mcp", "give exactly one of url (a streamable HTTP server) or command"),
    ("a placeholder in the upstream URL's host is refused (the agent would choose where "
     "the tool's credentials go)", with_(upstream={"url": "http://{{args.host}}/x"}),
     "upstream.url", "write the host in the manifest"),
    ("a single-brace {id} in the upstream URL is refused with the double-brace form",
     with_(upstream={"url": "https://api.example.com/orders/{id}"}),
     "upstream.url", "write {{args.id}}"),
    ("an unknown field is refused with a suggestion", with_(permision="x"),
     "permision", "unknown field 'permision' (did you mean 'permission'?)"),
    ("an unknown nested field is refused", with_(compensation__argumnt_map={}),
     "compensation.argumnt_map", "unknown field 'argumnt_map'"),
    ("an unknown field gets no 'belongs under' a block it cannot have been meant for",
     with_(upstream={"mcp": {"url": "http://127.0.0.1:9/mcp", "tool": "t", "name": "n"}}),
     "upstream.mcp.name", "unknown field 'name': remove it or fix its spelling (upstream.mcp takes:"),
    ("a field written one level too shallow is told where it belongs",
     with_(argument_map={}), "argument_map", "argument_map belongs under compensation"),
    ("a missing required field is named", with_(permission=DELETE),
     "permission", "is required"),
    ("a malformed duration is refused", with_(timeout_ms="30 seconds"),
     "timeout_ms", "is not a duration"),
    ("an unknown effect is refused", with_(effect="maybe"),
     "effect", "input should be 'read_only'"),
    ("a verification with absent expects no values",
     with_(compensation__verification__absent=True),
     "compensation.verification.expect", "and absent cannot both be given"),
    ("a verification without expect or absent is refused",
     with_(compensation__verification__expect=DELETE),
     "compensation.verification.expect", "or absent: true"),
    ("absent: false is refused",
     with_(compensation__verification__absent=False),
     "compensation.verification.absent", "leave absent out"),
    ("an absent status that is not a client error is refused",
     with_(compensation__verification__expect=DELETE,
           compensation__verification__absent={"statuses": [404, 200]}),
     "compensation.verification.absent.statuses[1]", "200 is not a status from 400 to 499"),
    ("an empty absent shape is refused",
     with_(compensation__verification__expect=DELETE,
           compensation__verification__absent={"shape": {}}),
     "compensation.verification.absent.shape", "every answer would mean gone"),
    ("done_statuses need a read-back to confirm them",
     with_(compensation__verification=DELETE, compensation__done_statuses=[404]),
     "compensation.done_statuses", "needs compensation.verification"),
    ("a done status that is not a client error is refused",
     with_(compensation__done_statuses=[500]),
     "compensation.done_statuses[0]", "500 is not a status from 400 to 499"),
    ("verification retries stay between 1 and 10",
     with_(compensation__verification__retries=11),
     "compensation.verification.retries", "less than or equal to 10"),
    ("an input_schema that is not valid JSON Schema is refused",
     with_(input_schema={"type": "object", "required": "owner"}),
     "input_schema.required", "is not valid JSON Schema 2020-12"),
    ("an input_schema whose $ref points outside it is refused (nothing is fetched)",
     with_(input_schema={"type": "object", "properties": {
         "owner": {"$ref": "http://127.0.0.1:9/owner.json"}}}),
     "input_schema.properties.owner.$ref", "points outside the schema"),
    ("an input_schema of another dialect is refused",
     with_(input_schema={"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"}),
     "input_schema.$schema", "2020-12 only"),
    ("an input_schema that is not an object schema is refused",
     with_(input_schema={"type": "array"}), "input_schema.type", "write type: object"),
    ("an undo reading $current needs the read before the undo",
     with_(compensation__argument_map={"order_id": "$result.id", "rev": "$current._rev"}),
     "compensation.argument_map.rev", "compensation.current is not declared"),
    ("an undo header is an HTTP header name",
     with_(compensation__headers={"If Match": "$result.rev"}),
     "compensation.headers.If Match", "is not an HTTP header name"),
    ("an object key cannot read the state read before the undo",
     with_(compensation__current={"tool": "shop.get_order", "arguments": {"id": "$result.id"}},
           compensation__object=["$current.id"]),
     "compensation.object[0]", "an object key cannot read $current"),
    ("a read after the call serves only a capture's divergence check",
     with_(compensation__verification={"tool": "shop.get_order", "arguments": {"order_id": "$result.id"},
                                       "expect": {"state": "cancelled"}, "after_call": True}),
     "compensation.verification.after_call", "without a capture there is none"),
]


@pytest.mark.parametrize(("data", "path", "message"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_manifest_breaking_one_rule_gets_exactly_that_error(
    data: dict[str, Any], path: str, message: str
) -> None:
    found = issues_of(data)
    assert len(found) == 1, found
    assert found[0][0] == path
    assert message in found[0][1]


def test_every_manifest_rule_has_a_case() -> None:
    # A new rule must come with a case above; its docstring-free name is matched loosely by
    # checking that each rule fires for at least one case.
    fired = set()
    for _, data, _, _ in CASES:
        manifest, _ = validate_manifest(data)
        if manifest is None:
            continue
        for rule in MANIFEST_RULES:
            if list(rule(manifest)):
                fired.add(rule.__name__)
    assert fired == {r.__name__ for r in MANIFEST_RULES}


def parsed(*datas: dict[str, Any]) -> list[Any]:
    out = []
    for d in datas:
        m, issues = validate_manifest(d)
        assert m is not None and not issues, issues
        out.append(m)
    return out


def test_a_complete_set_is_valid() -> None:
    assert validate_set(parsed(BASE, READ, CANCEL)) == []


def test_the_read_before_an_undo_must_be_a_read_only_tool_of_the_set() -> None:
    current = with_(compensation__current={"tool": "shop.cancel_order",
                                           "arguments": {"order_id": "$result.id"}})
    found = [(i.path, i.message) for i in validate_set(parsed(current, READ, CANCEL))]
    assert found == [("compensation.current.tool", "'shop.cancel_order' is idempotent; a "
                      "read-back tool must be read_only")]


def test_a_missing_compensation_tool_is_named() -> None:
    issues = validate_set(parsed(BASE, READ))
    assert [(i.tool, i.path) for i in issues] == [("shop.create_order", "compensation.tool")]
    assert "'shop.cancel_order', which has no manifest" in issues[0].message


def test_every_reference_place_must_exist() -> None:
    data = with_(requires=["a.required"], lookup={"tool": "a.lookup", "by": "idempotency_key",
                                                  "arguments": {"k": "$key"}},
                 draft={"tool": "a.draft", "promote": "a.promote", "discard": "a.discard"})
    paths = [i.path for i in validate_set(parsed(data, READ, CANCEL))]
    assert paths == ["requires[0].tool", "lookup.tool", "draft.tool", "draft.promote", "draft.discard"]


def test_replaced_by_must_exist() -> None:
    data = {**READ, "tool": "old.read", "lifecycle": "deprecated", "replaced_by": "new.read"}
    issues = validate_set(parsed(data))
    assert [(i.path, "'new.read'" in i.message) for i in issues] == [("replaced_by", True)]


def test_a_verification_tool_must_be_read_only() -> None:
    cancel_as_check = with_(compensation__verification__tool="shop.cancel_order")
    issues = validate_set(parsed(cancel_as_check, READ, CANCEL))
    assert [(i.path, i.message) for i in issues] == [
        ("compensation.verification.tool", "'shop.cancel_order' is idempotent; a read-back tool must be read_only")]


def test_a_lookup_tool_must_be_read_only() -> None:
    data = with_(lookup={"tool": "shop.cancel_order", "by": "id", "arguments": {"id": "$args.order_id"}})
    issues = validate_set(parsed(data, READ, CANCEL))
    assert [i.path for i in issues] == ["lookup.tool"]


def test_a_capture_tool_must_exist_and_be_read_only() -> None:
    capture = {"tool": "shop.cancel_order", "arguments": {"order_id": "$args.order_id"}}
    issues = validate_set(parsed(with_(capture=capture), READ, CANCEL))
    assert [(i.path, i.message) for i in issues] == [
        ("capture.tool", "'shop.cancel_order' is idempotent; a read-back tool must be read_only")]
    issues = validate_set(parsed(with_(capture={**capture, "tool": "shop.read"}), READ, CANCEL))
    assert [i.path for i in issues] == ["capture.tool"]
    assert "has no manifest" in issues[0].message


def test_an_undo_and_its_read_back_may_read_the_captured_state() -> None:
    data = with_(capture={"tool": "shop.get_order", "arguments": {"order_id": "$args.order_id"}},
                 compensation__argument_map={"order_id": "$result.id", "note": "$before.note?"},
                 compensation__verification__arguments={"order_id": "$result.id",
                                                        "v": "$before.version"},
                 compensation__verification__expect={"note": "$before.note"})
    assert issues_of(data) == []
    assert validate_set(parsed(data, READ, CANCEL)) == []


def test_duplicate_tool_names_are_refused() -> None:
    issues = validate_set(parsed(READ, READ))
    assert [(i.tool, i.path) for i in issues] == [("shop.get_order", "tool")]
    assert "declared more than once" in issues[0].message


def test_two_tools_served_under_one_mcp_name_are_refused() -> None:
    issues = validate_set(parsed(READ, {**READ, "tool": "shop__get_order"}))
    assert [(i.tool, i.path) for i in issues] == [("shop__get_order", "tool")]
    assert "would both be served over MCP as 'shop__get_order'" in issues[0].message


def test_a_requires_cycle_is_refused_with_its_path() -> None:
    a = {**READ, "tool": "a", "requires": ["b"]}
    b = {**READ, "tool": "b", "requires": ["c"]}
    c = {**READ, "tool": "c", "requires": ["a"]}
    issues = validate_set(parsed(a, b, c))
    assert [(i.tool, i.path) for i in issues] == [("a", "requires")]
    assert "a -> b -> c -> a" in issues[0].message


def test_every_set_rule_is_exercised() -> None:
    names = {r.__name__ for r in SET_RULES}
    assert names == {"no_duplicate_tools", "referenced_tools_exist", "read_backs_are_read_only",
                     "requires_has_no_cycle", "mcp_names_are_distinct"}


def test_defaults_are_filled_as_documented() -> None:
    m = parsed({"tool": "t", "effect": "idempotent", "permission": "p", "retry": {},
                "idempotency": {"key": "{{args.a}}"}})[0]
    assert m.approval.required is False
    assert m.version == 1 and m.lifecycle == "approved"
    assert (m.retry.attempts, m.retry.base_ms, m.retry.max_ms) == (3, 200, 5000)
    assert m.idempotency.scope == "run"
    c = parsed(BASE)[0].compensation
    assert c.kind == "compensation" and c.requires_approval is False
    assert (c.verification.retries, c.verification.backoff_ms) == (3, 1000)


def test_approval_forms_normalize_to_one_shape() -> None:
    always = parsed({**READ, "approval": "always"})[0].approval
    obj = parsed({**READ, "approval": {"roles": ["x"]}})[0].approval
    never_obj = parsed({**READ, "approval": {"required": False}})[0].approval
    assert always.required and obj.required and not never_obj.required
    assert always.model_dump().keys() == obj.model_dump().keys()


def test_irreversible_tools_are_forced_to_need_approval() -> None:
    m = parsed({"tool": "mail.send", "effect": "irreversible", "permission": "mail:send"})[0]
    assert m.approval.required is True


def test_a_non_mapping_is_refused_with_a_sentence() -> None:
    manifest, issues = validate_manifest(["not", "a", "mapping"])
    assert manifest is None and "must be a mapping" in issues[0].message


def test_a_field_error_does_not_hide_the_rule_errors_of_the_same_manifest() -> None:
    data = {"tool": "shop.pay", "effect": "compensable", "permission": "shop:write", "colour": "red",
            "timeout_ms": "soon", "retry": {"attempts": 2}}
    model, issues = validate_manifest(data)
    assert model is None
    paths = {i.path for i in issues}
    assert {"colour", "timeout_ms", "retry", "compensation"} <= paths


def test_a_rule_about_a_field_that_failed_is_not_reported_twice() -> None:
    data = {"tool": "shop.pay", "effect": "compensable", "permission": "shop:write",
            "compensation": {"tool": "shop.refund", "argument_map": "nope"}}
    _, issues = validate_manifest(data)
    assert [i.path for i in issues] == ["compensation.argument_map"]


@pytest.mark.parametrize("url", [
    "http://{{args.host}}/x",
    "https://api.example.com{{args.suffix}}/x",  # .evil.example would extend the host
    "https://api.example.com:{{args.port}}/x",
    "https://{{args.user}}@api.example.com/x",
    "{{args.scheme}}://api.example.com/x",
])
def test_an_agent_cannot_send_the_tools_credentials_to_a_host_it_chooses(url: str) -> None:
    data = with_(upstream={"url": url, "headers": {"Authorization": {
        "secretKeyRef": {"name": "shop", "key": "token"}}}})
    assert [path for path, _ in issues_of(data)] == ["upstream.url"], issues_of(data)


def test_placeholders_in_the_path_and_query_values_stay_allowed() -> None:
    data = with_(upstream={"url": "https://api.example.com/orders/{{args.order_id}}?"
                           "expand={{args.expand}}"})
    assert issues_of(data) == []


def test_an_expect_key_may_start_with_an_index_as_a_result_reference_may() -> None:
    # a read-back that answers a list: [0].email, as $result[0].id reads the call's answer
    spec = with_(compensation__verification__expect={"[0].email": "$result[0].email",
                                                     "[1]": {"const": None}})
    assert issues_of(spec) == []
    assert issues_of(with_(compensation__verification__expect={"[x].email": "a"}))


def test_an_expected_list_item_is_compared_at_its_index() -> None:
    from unwind.ledger.undo import first_mismatch
    answer = [{"email": "old@example.com"}]
    assert first_mismatch({"[0].email": "old@example.com"}, answer) is None
    assert first_mismatch({"[0].email": "new@example.com"}, answer) == (
        '[0].email is "old@example.com", expected "new@example.com"')
    assert first_mismatch({"[1].email": "x"}, answer) == 'the answer has no [1].email, expected "x"'
