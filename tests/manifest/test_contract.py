"""Contract tests: loading case files, and running every case field both ways (a case that
holds passes, a case that does not fails with a message saying why)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from unwind.manifest.contract import (
    CaseResult,
    Report,
    TestCase,
    format_text,
    load_cases,
    load_cases_text,
    plan_call,
    report_json,
    run_case,
    run_cases,
)
from unwind.manifest.loader import check_paths
from unwind.manifest.model import ToolManifest

ROOT = Path(__file__).parents[2]

SPECS: list[dict[str, Any]] = [
    {"tool": "stripe.get_charge", "effect": "read_only", "permission": "payments:read"},
    {"tool": "stripe.refund", "effect": "idempotent", "permission": "payments:refund"},
    {"tool": "stripe.create_charge", "effect": "compensable", "permission": "payments:write",
     "idempotency": {"key": "charge-{{args.order_id}}"},
     "compensation": {
         "tool": "stripe.refund", "residue": ["still on the statement"],
         "argument_map": {"charge_id": "$result.id", "amount": "$args.amount",
                          "reason": "$args.reason?"},
         "verification": {"tool": "stripe.get_charge", "arguments": {"charge_id": "$result.id"},
                          "expect": {"refunded": True, "refunds.0.status": "succeeded"}}}},
    {"tool": "mail.send", "effect": "irreversible", "permission": "mail:send"},
    {"tool": "ship.void_label", "effect": "idempotent", "permission": "ship:write"},
    {"tool": "ship.create_label", "effect": "reversible", "permission": "ship:write",
     "requires": ["stripe.create_charge"],
     "compensation": {"tool": "ship.void_label", "kind": "inverse",
                      "argument_map": {"label_id": "$result.label_id"}}},
    {"tool": "promo.preview", "effect": "read_only", "permission": "promo:read",
     "lifecycle": "draft"},
]
MANIFESTS = [ToolManifest.model_validate(s) for s in SPECS]
BY_NAME = {m.tool: m for m in MANIFESTS}

CHARGE: dict[str, Any] = {"tool": "stripe.create_charge", "args": {"order_id": "o1", "amount": 2500},
                          "result": {"id": "ch_1"}}
REFUNDED = {"refunded": True, "refunds": [{"status": "succeeded"}]}


def run(**fields: Any) -> CaseResult:
    return run_case(TestCase.model_validate({"name": "case", **fields}), BY_NAME)


def passes(**fields: Any) -> None:
    result = run(**fields)
    assert result.ok, result.message
    assert result.message is None


def fails(**fields: Any) -> str:
    result = run(**fields)
    assert not result.ok
    assert result.message
    return result.message


# ---- tool, lifecycle, after / requires ---------------------------------------------------

def test_an_unknown_tool_fails_the_case() -> None:
    assert fails(tool="nope.tool") == "no manifest for tool nope.tool"


def test_a_call_without_expectations_passes_when_it_is_accepted() -> None:
    passes(**CHARGE)


def test_a_draft_tool_is_refused_and_expect_blocked_accepts_that() -> None:
    passes(tool="promo.preview", expect_blocked="is a draft")
    assert "the manifest of promo.preview is a draft" in fails(tool="promo.preview")


def test_requires_are_run_first_by_default() -> None:
    passes(tool="ship.create_label", result={"label_id": "l1"}, expect_plan="compensate")


def test_an_explicit_after_that_leaves_out_a_required_tool_blocks_the_call() -> None:
    passes(tool="ship.create_label", after=[], expect_blocked="requires stripe.create_charge")
    message = fails(tool="ship.create_label", after=["stripe.refund"])
    assert message.startswith("the call was refused: ship.create_label requires "
                              "stripe.create_charge to have succeeded earlier in the run")


def test_an_after_tool_without_a_manifest_fails_the_case() -> None:
    message = fails(tool="ship.create_label", after=["stripe.create_charge", "ghost"])
    assert message == "after names ghost, which has no manifest: it cannot run first"


# ---- expect_blocked and the idempotency key ---------------------------------------------

def test_an_unrenderable_key_blocks_the_call_with_its_reason() -> None:
    passes(tool="stripe.create_charge", args={"amount": 1}, expect_blocked="args.order_id")
    passes(tool="stripe.create_charge", args={"order_id": {"id": 1}}, expect_blocked="string, number or bool")
    assert "$args has no 'order_id'" in fails(tool="stripe.create_charge", args={"amount": 1})


def test_expect_blocked_fails_when_the_call_is_accepted() -> None:
    assert fails(**CHARGE, expect_blocked="draft") == (
        "the call was not refused; expected a refusal containing 'draft'")


def test_expect_blocked_fails_when_the_call_is_refused_for_another_reason() -> None:
    message = fails(tool="stripe.create_charge", args={}, expect_blocked="is a draft")
    assert message.startswith("the call was refused for another reason: the idempotency key")
    assert message.endswith("(expected one containing 'is a draft')")


# ---- fail --------------------------------------------------------------------------------

def test_a_failed_call_with_no_expectations_passes() -> None:
    passes(tool="stripe.create_charge", args={"order_id": "o1"}, fail="card declined")


def test_a_failed_call_plans_skip_and_has_no_handle() -> None:
    passes(tool="stripe.create_charge", args={"order_id": "o1"}, fail="declined", expect_plan="skip")
    message = fails(tool="stripe.create_charge", args={"order_id": "o1"}, fail="declined",
                    expect_plan="compensate", expect_handle={"charge_id": "ch_1"})
    assert "the plan is skip (the call failed (declined): nothing to undo), expected compensate" in message
    assert "there are no undo arguments (the call failed (declined): nothing to undo)" in message


def test_a_failed_call_has_nothing_to_verify() -> None:
    message = fails(tool="stripe.create_charge", args={"order_id": "o1"}, fail="declined",
                    verify_with=REFUNDED)
    assert message == "the call failed, so nothing is undone or read back"


# ---- expect_plan -------------------------------------------------------------------------

@pytest.mark.parametrize(("tool", "plan"), [
    ("stripe.get_charge", "skip"), ("stripe.refund", "skip"), ("mail.send", "unrecoverable"),
    ("stripe.create_charge", "compensate"), ("ship.create_label", "compensate")])
def test_each_effect_gets_its_plan(tool: str, plan: str) -> None:
    result = {"id": "ch_1", "label_id": "l1"}
    passes(tool=tool, args={"order_id": "o1", "amount": 1}, result=result, expect_plan=plan)


def test_an_irreversible_call_is_unrecoverable_because_nothing_can_undo_it() -> None:
    message = fails(tool="mail.send", expect_plan="compensate")
    assert message == ("the plan is unrecoverable (mail.send is irreversible: nothing can undo "
                       "it), expected compensate")


def test_a_missing_required_reference_makes_the_plan_unrecoverable_with_the_reason() -> None:
    passes(tool="stripe.create_charge", args={"order_id": "o1", "amount": 1}, result={},
           expect_plan="unrecoverable")
    message = fails(tool="stripe.create_charge", args={"order_id": "o1"}, result={},
                    expect_plan="compensate")
    assert "the undo is unavailable: charge_id: $result has no 'id'; amount: $args has no 'amount'" in message


def test_plan_call_reports_the_handle_for_a_compensate_plan() -> None:
    plan = plan_call(BY_NAME["stripe.create_charge"], {"amount": 5}, {"id": "ch_9"})
    assert plan == ("compensate", {"charge_id": "ch_9", "amount": 5}, None)


# ---- expect_handle -----------------------------------------------------------------------

def test_expect_handle_matches_the_resolved_undo_arguments_exactly() -> None:
    passes(**CHARGE, expect_handle={"charge_id": "ch_1", "amount": 2500})
    passes(**{**CHARGE, "args": {**CHARGE["args"], "reason": "fraud"}},
           expect_handle={"charge_id": "ch_1", "amount": 2500, "reason": "fraud"})


def test_expect_handle_fails_on_a_different_or_extra_value() -> None:
    message = fails(**CHARGE, expect_handle={"charge_id": "ch_1", "amount": "2500"})
    assert message == ('the undo arguments are {"amount": 2500, "charge_id": "ch_1"}, expected '
                       '{"amount": "2500", "charge_id": "ch_1"}: amount is 2500, expected "2500"')
    assert fails(**CHARGE, expect_handle={"charge_id": "ch_1", "amount": 2500, "reason": None}
                 ).endswith(": reason is missing")
    assert fails(**CHARGE, expect_handle={"charge_id": "ch_1"}).endswith(
        ": amount is not expected (it is 2500)")


def test_expect_handle_tells_a_bool_from_a_number() -> None:
    case = {**CHARGE, "args": {"order_id": "o1", "amount": True}}
    assert "the undo arguments are" in fails(**case, expect_handle={"charge_id": "ch_1", "amount": 1})


def test_expect_handle_fails_when_there_is_no_handle() -> None:
    message = fails(tool="stripe.refund", args={}, expect_handle={})
    assert message == "there are no undo arguments (stripe.refund is idempotent: a rollback skips it), expected {}"


# ---- expect_verification -----------------------------------------------------------------

def test_expect_verification_matches_the_resolved_read_back_arguments() -> None:
    passes(**CHARGE, expect_verification={"charge_id": "ch_1"})
    assert fails(**CHARGE, expect_verification={"charge_id": "ch_2"}) == (
        'the verification arguments are {"charge_id": "ch_1"}, expected {"charge_id": "ch_2"}: '
        'charge_id is "ch_1", expected "ch_2"')


def test_expect_verification_fails_when_its_arguments_are_missing() -> None:
    message = fails(**{**CHARGE, "result": {}}, expect_verification={"charge_id": "ch_1"})
    assert message == "the verification arguments are unavailable: charge_id: $result has no 'id'"


def test_expect_verification_fails_when_the_tool_declares_no_verification() -> None:
    message = fails(tool="ship.create_label", result={"label_id": "l1"}, expect_verification={})
    assert message == ("ship.create_label declares no compensation.verification: there is no "
                       "read-back to check")


# ---- verify_with / expect_verified -------------------------------------------------------

def test_a_matching_read_back_is_accepted() -> None:
    passes(**CHARGE, verify_with=REFUNDED, expect_verified=True)
    passes(**CHARGE, verify_with=REFUNDED)  # expect_verified defaults to true


def test_a_mismatching_read_back_fails_when_acceptance_is_expected() -> None:
    answer = {"refunded": False, "refunds": [{"status": "succeeded"}]}
    assert fails(**CHARGE, verify_with=answer, expect_verified=True) == (
        "the read-back would be rejected: refunded is false, expected true")


def test_a_read_back_is_matched_through_array_indices() -> None:
    answer = {"refunded": True, "refunds": [{"status": "pending"}]}
    assert fails(**CHARGE, verify_with=answer) == (
        'the read-back would be rejected: refunds.0.status is "pending", expected "succeeded"')
    assert fails(**CHARGE, verify_with={"refunded": True, "refunds": []}) == (
        'the read-back would be rejected: the answer has no refunds.0.status, expected "succeeded"')


def test_expect_verified_false_passes_on_a_mismatch_and_fails_on_a_match() -> None:
    passes(**CHARGE, verify_with={"refunded": 1, "refunds": REFUNDED["refunds"]},
           expect_verified=False)
    assert fails(**CHARGE, verify_with=REFUNDED, expect_verified=False) == (
        "the read-back would be accepted, but expect_verified is false")


def test_verify_with_fails_when_the_tool_declares_no_verification() -> None:
    assert "declares no compensation.verification" in fails(
        tool="ship.create_label", result={"label_id": "l1"}, verify_with={"x": 1})


# ---- expect_duplicate --------------------------------------------------------------------

def test_the_same_keyed_call_twice_is_refused_as_a_duplicate() -> None:
    passes(**CHARGE, expect_duplicate=True)


def test_a_duplicate_is_not_refused_after_the_first_call_failed() -> None:
    message = fails(tool="stripe.create_charge", args={"order_id": "o1"}, fail="declined",
                    expect_duplicate=True)
    assert message == ("the same call a second time was not refused as a duplicate: the first "
                       "call failed, so its key is free again")


def test_a_tool_without_an_idempotency_key_cannot_expect_a_duplicate() -> None:
    message = fails(tool="stripe.refund", expect_duplicate=True)
    assert message.startswith("stripe.refund declares no idempotency key")
    passes(tool="stripe.refund", expect_duplicate=False)
    passes(**CHARGE, expect_duplicate=False)  # not asserted


def test_every_failed_expectation_is_reported() -> None:
    message = fails(**CHARGE, expect_plan="skip", expect_verification={"charge_id": "x"})
    assert message.count("; ") == 1
    assert message.startswith("the plan is compensate, expected skip; ")


# ---- the case model ----------------------------------------------------------------------

@pytest.mark.parametrize(("fields", "text"), [
    ({"fail": "x", "result": {}}, "either succeeds (result) or fails (fail)"),
    ({"expect_verified": True}, "expect_verified needs verify_with"),
    ({"expect_blocked": "x", "expect_plan": "skip"}, "remove expect_plan or expect_blocked"),
    ({"expect_plan": "undo"}, "expect_plan"),
    ({"expect_handel": {}}, "unknown field 'expect_handel'"),
])
def test_contradictory_or_misspelled_case_fields_are_load_errors(fields: dict[str, Any], text: str) -> None:
    case = {"name": "c", "tool": "t", **fields}
    cases, errors = load_cases_text(json.dumps([case]), "t.json")
    assert cases == []
    assert len(errors) == 1
    assert text in str(errors[0])
    assert str(errors[0]).startswith("t.json:1: ")


# ---- loading -----------------------------------------------------------------------------

def test_cases_load_from_a_list_a_tests_mapping_and_several_documents(tmp_path: Path) -> None:
    (tmp_path / "a.test.yaml").write_text(
        "- name: one\n  tool: t\n---\ntests:\n  - name: two\n    tool: t\n"
        "  - name: three\n    tool: t\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.json").write_text('[{"name": "four", "tool": "t"}]')
    (tmp_path / ".hidden.yaml").write_text("not: [valid")
    cases, errors = load_cases([tmp_path])
    assert errors == []
    assert [(c.name, Path(c.file or "").name, c.line) for c in cases] == [
        ("one", "a.test.yaml", 1), ("two", "a.test.yaml", 5), ("three", "a.test.yaml", 7),
        ("four", "b.json", 1)]


def test_a_yaml_syntax_error_is_one_line_with_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- name: a\n  tool: t\n- name: [b\n")
    cases, errors = load_cases([bad])
    assert cases == []
    assert len(errors) == 1
    text = str(errors[0])
    assert text.startswith(f"{bad}:") and "YAML syntax error" in text
    assert "\n" not in text and errors[0].line is not None


def test_a_bad_field_is_reported_at_its_own_line() -> None:
    _, errors = load_cases_text("- name: a\n  tool: t\n  expect_plan: later\n", "f.yaml")
    assert [(e.line, e.path) for e in errors] == [(3, "expect_plan")]
    assert errors[0].message.startswith("case 'a': ")


@pytest.mark.parametrize(("text", "message"), [
    ("other: 1\n", "a list of cases or a mapping with only tests"),
    ("tests: []\nmanifests: x\n", "found keys ['manifests']"),
    ("tests: 3\n", "expected a list of test cases"),
    ("- just a string\n", "a test case must be a mapping"),
])
def test_a_file_that_is_not_a_list_of_cases_is_an_error(text: str, message: str) -> None:
    cases, errors = load_cases_text(text, "f.yaml")
    assert cases == [] and len(errors) == 1 and message in errors[0].message


def test_case_names_must_be_unique(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("- {name: same, tool: t}\n- {name: same, tool: u}\n")
    cases, errors = load_cases([tmp_path])
    assert len(cases) == 2
    assert [e.line for e in errors] == [2]
    assert "case 'same' is also defined at" in errors[0].message


def test_a_missing_path_is_an_error() -> None:
    _, errors = load_cases(["/nonexistent/tests"])
    assert [e.message for e in errors] == ["no such file or folder"]


# ---- the report --------------------------------------------------------------------------

def test_the_report_lists_results_and_tools_no_case_covers() -> None:
    cases = [TestCase.model_validate({"name": "ok one", **CHARGE}),
             TestCase.model_validate({"name": "bad one", "tool": "mail.send",
                                      "expect_plan": "skip"})]
    report = run_cases(cases, MANIFESTS)
    assert report.not_covered == ["promo.preview", "ship.create_label", "ship.void_label",
                                  "stripe.get_charge", "stripe.refund"]
    why = "the plan is unrecoverable (mail.send is irreversible: nothing can undo it), expected skip"
    assert report_json(report) == {
        "ok": False, "passed": 1, "failed": 1,
        "results": [{"name": "ok one", "ok": True, "message": None, "tool": "stripe.create_charge",
                     "file": None, "line": None, "failures": []},
                    {"name": "bad one", "ok": False, "message": why, "tool": "mail.send",
                     "file": None, "line": None,
                     "failures": [{"field": "expect_plan", "message": why, "line": None}]}],
        "not_covered": report.not_covered}
    assert format_text(report).splitlines() == [
        "ok   ok one",
        "FAIL bad one",
        f"  expect_plan: {why}",
        "not covered by any test: promo.preview, ship.create_label, ship.void_label, "
        "stripe.get_charge, stripe.refund",
        "1 passed, 1 failed"]


def test_an_all_passing_report_says_only_how_many_passed() -> None:
    report = Report([CaseResult("a", True, None)], [])
    assert format_text(report) == "ok   a\n1 passed"
    assert report.ok


def test_the_example_payments_contract_tests_pass_and_cover_every_tool() -> None:
    checked = check_paths([ROOT / "manifests" / "payments.yaml"])
    assert checked.ok
    cases, errors = load_cases([ROOT / "tests" / "contracts" / "payments.test.yaml"])
    assert errors == []
    report = run_cases(cases, checked.manifests)
    assert report.failed == 0, format_text(report)
    assert report.not_covered == []
    assert {c.tool for c in cases} == {"stripe.get_charge", "stripe.create_charge", "stripe.refund"}


def test_a_failure_names_the_file_and_line_of_the_expectation_it_is_about(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(
        "tests:\n"
        "  - name: refund handle\n"
        "    tool: stripe.create_charge\n"
        "    args: {order_id: o1, amount: 2500}\n"
        "    result: {id: ch_1}\n"
        "    expect_handle:\n"
        "      charge_id: ch_9\n")
    cases, errors = load_cases([tmp_path])
    assert errors == []
    report = run_cases(cases, MANIFESTS)
    failure = report.results[0].failures[0]
    assert (report.results[0].line, failure.field, failure.line) == (2, "expect_handle", 6)
    assert f"  {tmp_path / 't.yaml'}:6: expect_handle: the undo arguments are" in format_text(report)
    assert failure.message.endswith('charge_id is "ch_1", expected "ch_9"')


def test_a_case_naming_a_tool_that_does_not_exist_suggests_the_closest_one() -> None:
    assert fails(tool="stripe.refnud") == "no manifest for tool stripe.refnud (did you mean stripe.refund?)"


def test_a_key_given_twice_in_a_case_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text("- name: a\n  tool: stripe.refund\n  name: b\n")
    _, errors = load_cases([tmp_path])
    assert [(e.line, e.path) for e in errors] == [(3, "[0].name")]


def test_a_case_gives_the_captured_state_that_before_reads() -> None:
    specs = [
        {"tool": "crm.get_customer", "effect": "read_only", "permission": "crm:read"},
        {"tool": "crm.restore_customer", "effect": "idempotent", "permission": "crm:write"},
        {"tool": "crm.update_customer", "effect": "reversible", "permission": "crm:write",
         "capture": {"tool": "crm.get_customer", "arguments": {"id": "$args.id"}},
         "compensation": {
             "tool": "crm.restore_customer", "kind": "inverse",
             "argument_map": {"id": "$args.id", "email": "$before.email"},
             "verification": {"tool": "crm.get_customer", "arguments": {"id": "$args.id"},
                              "expect": {"email": "$before.email"}}}}]
    by_name = {m.tool: m for m in (ToolManifest.model_validate(s) for s in specs)}
    case = {"name": "update", "tool": "crm.update_customer",
            "args": {"id": "c1", "email": "new@example.com"},
            "result": {"id": "c1", "email": "new@example.com"},
            "before": {"id": "c1", "email": "old@example.com"},
            "expect_plan": "compensate",
            "expect_handle": {"id": "c1", "email": "old@example.com"},
            "verify_with": {"id": "c1", "email": "old@example.com"}}
    result = run_case(TestCase.model_validate(case), by_name)
    assert result.ok, result.message
    without = run_case(TestCase.model_validate({**case, "before": None}), by_name)
    assert not without.ok
    assert "nothing was captured before the call" in (without.message or "")
