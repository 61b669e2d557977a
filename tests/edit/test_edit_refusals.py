"""Refusals: each answers with a code, the current revision, and nothing to write."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from edit_helpers import before

from unwind.edit import EditResult, Location, remove, rename, revision

READERS_OF_GET_CHARGE = [
    Location("manifests/disputes.yaml", 5, "stripe.create_dispute_response: requires[0]"),
    Location("manifests/disputes.yaml", 7, "stripe.create_dispute_response: lookup.tool"),
    Location("manifests/disputes.yaml", 22, "stripe.legacy_charge_lookup: replaced_by"),
    Location("manifests/payments.yaml", 15, "stripe.create_charge: compensation.verification.tool"),
]


def assert_refused(result: EditResult, files: Mapping[str, str], code: str) -> None:
    assert not result.success
    assert [e.code for e in result.errors] == [code] * len(result.errors)
    assert result.errors
    assert result.files == {}
    assert result.revision == revision(files)
    assert result.to_json()["changes"] == {"renamed": [], "removed": [], "rewrote": 0, "files": []}


def test_removing_a_tool_others_read_is_refused_with_every_reader() -> None:
    files = before("rename_across_files")
    result = remove(files, ["stripe.get_charge"])
    assert_refused(result, files, "has_references")
    (error,) = result.errors
    assert list(error.references) == READERS_OF_GET_CHARGE
    assert (
        error.message == 'tool "stripe.get_charge" is read in 4 places; edit or remove them first'
    )


def test_a_test_case_that_runs_a_removed_tool_first_is_a_reader() -> None:
    files = before("rename_in_contract_tests")
    result = remove(files, ["stripe.get_charge"])
    assert_refused(result, files, "has_references")
    assert list(result.errors[0].references) == [
        Location("payments.test.yaml", 12, "tests[1].after[0]")
    ]


def test_removing_the_readers_in_the_same_request_is_allowed() -> None:
    files = before("rename_across_files")
    tools = [
        "stripe.get_charge",
        "stripe.create_dispute_response",
        "stripe.legacy_charge_lookup",
        "stripe.create_charge",
    ]
    result = remove(files, tools)
    assert result.success, result.errors
    assert result.changes.removed == [
        *tools,
        'test case "a charge is refunded with the right arguments, and the read-back is checked"'
        " in tests/payments.test.yaml",
        'test case "reading a charge needs nothing first" in tests/payments.test.yaml',
    ]
    new = {**files, **result.files}
    assert new["manifests/payments.yaml"] == (
        "---\ntool: stripe.refund\neffect: idempotent\npermission: payments:write\n...\n"
    )
    assert new["manifests/disputes.yaml"] == ""
    assert new["tests/payments.test.yaml"] == ""


def test_each_missing_tool_in_a_removal_is_not_found() -> None:
    files = before("rename_keeps_comments")
    result = remove(files, ["stripe.refund", "stripe.nope", "stripe.gone"])
    assert_refused(result, files, "not_found")
    assert [e.message for e in result.errors] == [
        'no tool named "stripe.nope" in these files (1 file read)',
        'no tool named "stripe.gone" in these files (1 file read)',
    ]


def test_a_stale_base_revision_is_refused_and_reports_the_current_one() -> None:
    files = before("rename_keeps_comments")
    for result in (
        rename(files, "stripe.refund", "stripe.refunds.create", base_revision="000000000000"),
        remove(files, ["stripe.get_customer"], base_revision="000000000000"),
    ):
        assert_refused(result, files, "stale")
    fresh = rename(files, "stripe.refund", "stripe.refunds.create", base_revision=revision(files))
    assert fresh.success
    assert fresh.revision == revision({**files, **fresh.files}) != revision(files)


@pytest.mark.parametrize("bad", ["stripe refund", "", "x" * 129, "stripe.refund!", "ümlaut"])
def test_an_invalid_new_name_is_refused(bad: str) -> None:
    files = before("rename_keeps_comments")
    assert_refused(rename(files, "stripe.refund", bad), files, "invalid_name")


def test_renaming_onto_an_existing_tool_is_a_conflict() -> None:
    files = before("rename_keeps_comments")
    result = rename(files, "stripe.refund", "stripe.get_charge")
    assert_refused(result, files, "conflict")
    assert [r.path for r in result.errors[0].references] == [
        "stripe.get_charge: tool",
        "stripe.create_charge: compensation.verification.tool",
    ]


def test_renaming_onto_a_name_only_referenced_is_a_conflict() -> None:
    # Merging a dangling reference into the renamed tool could not be undone by renaming back.
    files = {
        "a.yaml": "- tool: a\n  effect: read_only\n- tool: b\n  effect: read_only\n"
        "  requires: [ghost]\n"
    }
    assert_refused(rename(files, "a", "ghost"), files, "conflict")


def test_renaming_a_tool_that_does_not_exist_is_not_found() -> None:
    files = before("rename_keeps_comments")
    assert_refused(rename(files, "stripe.nope", "stripe.other"), files, "not_found")
    # a reader alone does not define a tool
    files = {"a.yaml": "- tool: b\n  effect: read_only\n  requires: [ghost]\n"}
    assert_refused(rename(files, "ghost", "spirit"), files, "not_found")


def test_a_validator_message_refuses_the_edit() -> None:
    files = before("rename_keeps_comments")
    seen: list[Mapping[str, str]] = []

    def validator(new_files: Mapping[str, str], old_files: Mapping[str, str]) -> list[str]:
        assert old_files == files
        seen.append(new_files)
        return ["stripe.refunds.create: effect: idempotent tools may not be renamed on Fridays"]

    result = rename(files, "stripe.refund", "stripe.refunds.create", validator=validator)
    assert_refused(result, files, "invalid")
    assert result.errors[0].message.startswith("stripe.refunds.create: effect:")
    (given,) = seen
    assert set(given) == set(files)
    assert "tool: stripe.refunds.create" in given["payments.yaml"]


def test_a_validator_with_nothing_to_say_lets_the_edit_through() -> None:
    files = before("remove_with_readers")
    result = remove(files, ["stripe.list_charges"], validator=lambda after, before: [])
    assert result.success


def test_a_file_that_is_not_yaml_is_refused() -> None:
    files = {**before("rename_keeps_comments"), "broken.yaml": "tool: [unclosed\n"}
    assert_refused(rename(files, "stripe.refund", "stripe.r2"), files, "parse_error")


def test_the_json_answer_has_exactly_the_documented_shape() -> None:
    files = before("rename_across_files")
    template = "{{- if .Values.rbac }}\nkind: Role  # reads stripe.get_charge\n{{- end }}\n"
    refusal = remove({**files, "chart/templates/role.yaml": template}, ["stripe.get_charge"])
    skipped = {
        "file": "chart/templates/role.yaml",
        "reason": "a Helm template ({{ ... }}): not plain YAML, not edited",
        "mentions": ["stripe.get_charge"],
    }
    assert refusal.to_json() == {
        "success": False,
        "revision": revision(files),
        "changes": {"renamed": [], "removed": [], "rewrote": 0, "files": []},
        "errors": [
            {
                "code": "has_references",
                "message": 'tool "stripe.get_charge" is read in 4 places; edit or remove them first',
                "references": [
                    {"file": r.file, "line": r.line, "path": r.path} for r in READERS_OF_GET_CHARGE
                ],
            }
        ],
        "skipped": [skipped],
    }
    ok = rename(files, "stripe.refund", "stripe.refunds.create")
    assert ok.to_json() == {
        "success": True,
        "revision": ok.revision,
        "changes": {
            "renamed": [{"from": "stripe.refund", "to": "stripe.refunds.create"}],
            "removed": [],
            "rewrote": 1,
            "files": ["manifests/payments.yaml"],
        },
        "errors": [],
        "skipped": [],
    }


def test_a_rename_to_a_tool_with_no_valid_object_name_leaves_metadata_name_alone() -> None:
    from unwind.edit import rename

    files = {"m.yaml": "apiVersion: unwind.dev/v1alpha1\nkind: ToolManifest\nmetadata:\n"
                       "  name: shop.get-order\nspec:\n  tool: shop.get_order\n  effect: read_only\n"
                       "  permission: shop:read\n"}
    result = rename(files, "shop.get_order", "_")
    assert result.success, result.errors
    assert "  name: shop.get-order\n" in result.files["m.yaml"]  # "-" would not be a valid name
    back = rename(result.files, "_", "shop.get_order")
    assert back.files["m.yaml"] == files["m.yaml"]
