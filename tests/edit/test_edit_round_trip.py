"""Round-trip fixtures: each edit must turn `before/` into `after/` byte for byte."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import pytest
from edit_helpers import after, before

from unwind.edit import EditResult, remove, rename

Op = Callable[[Mapping[str, str]], EditResult]

CASES: dict[str, tuple[Op, dict[str, object]]] = {
    "rename_keeps_comments": (
        lambda f: rename(f, "stripe.refund", "stripe.refunds.create"),
        {"renamed": [{"from": "stripe.refund", "to": "stripe.refunds.create"}], "rewrote": 1},
    ),
    "rename_in_flow_and_quoted": (
        lambda f: rename(f, "stripe.get_charge", "stripe.charges.retrieve"),
        {"rewrote": 4},
    ),
    "rename_across_files": (
        lambda f: rename(f, "stripe.get_charge", "stripe.charges.get"),
        {"rewrote": 5},
    ),
    "rename_in_contract_tests": (
        lambda f: rename(f, "stripe.create_charge", "payments.charges.create"),
        {"rewrote": 5},
    ),
    "rename_tool_manifest_resources": (
        lambda f: rename(f, "stripe.create_charge", "stripe.charges.create"),
        {"rewrote": 2},
    ),
    "remove_with_readers": (
        lambda f: remove(f, ["stripe.create_charge", "stripe.refund"]),
        {
            "removed": [
                "stripe.create_charge",
                "stripe.refund",
                'test case "a charge is refunded with the right arguments" in payments.test.yaml',
                'test case "a refund is idempotent" in payments.test.yaml',
            ],
            "rewrote": 0,
        },
    ),
    "rename_in_tests_mapping": (
        lambda f: rename(f, "stripe.create_charge", "payments.charges.create"),
        {"rewrote": 4},
    ),
    "remove_from_tests_mapping": (
        lambda f: remove(f, ["stripe.refund", "stripe.create_charge"]),
        {
            "removed": [
                "stripe.refund",
                "stripe.create_charge",
                'test case "a charge is refunded" in payments.test.yaml',
                'test case "a refund twice" in payments.test.yaml',
                'test case "a refund alone" in payments.test.yaml',
            ],
            "rewrote": 0,
        },
    ),
    "remove_documents_and_list_items": (
        lambda f: remove(f, ["stripe.legacy_lookup", "stripe.audit_charge"]),
        {"removed": ["stripe.legacy_lookup", "stripe.audit_charge"]},
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_edit_turns_before_into_after_byte_for_byte(case: str) -> None:
    op, expected_changes = CASES[case]
    files = before(case)
    expected = after(case)
    result = op(files)
    assert result.success, result.errors
    assert {**files, **result.files} == expected
    assert result.changes.files == sorted(p for p in files if files[p] != expected[p])
    assert set(result.files) == set(result.changes.files)
    changes = result.to_json()["changes"]
    for key, value in expected_changes.items():
        assert changes[key] == value


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fixture_pairs_really_differ(case: str) -> None:
    # A fixture whose before and after are equal would prove nothing.
    assert before(case) != after(case)
