"""Scalar styles, YAML features and layouts the splicer must handle without touching other bytes."""

from __future__ import annotations

import pytest

from unwind.edit import k8s_name, remove, rename


def renamed(text: str, old: str, new: str) -> str:
    result = rename({"m.yaml": text}, old, new)
    assert result.success, result.errors
    return result.files.get("m.yaml", text)


def removed(text: str, *tools: str) -> str:
    result = remove({"m.yaml": text}, list(tools))
    assert result.success, result.errors
    return result.files.get("m.yaml", text)


BASE = "- tool: a.read\n  effect: read_only\n- tool: a.write\n  effect: idempotent\n"


@pytest.mark.parametrize(
    ("new", "written"),
    [("true", "'true'"), ("123", "'123'"), ("1e3", "'1e3'"), ("yes", "'yes'"), ("x:", "'x:'")],
)
def test_a_plain_name_that_would_not_read_back_as_a_string_gets_single_quotes(
    new: str, written: str
) -> None:
    text = BASE + "  requires: [a.read]\n"
    out = renamed(text, "a.read", new)
    assert out == text.replace("a.read", written)


def test_quoted_names_keep_their_quote_character() -> None:
    text = (
        '- tool: "a.read"\n  effect: read_only\n- tool: b\n  effect: idempotent\n'
        "  requires: ['a.read', \"a.read\"]\n"
    )
    assert renamed(text, "a.read", "a.get") == text.replace("a.read", "a.get")


def test_a_block_scalar_name_keeps_its_header_and_indentation() -> None:
    text = "- tool: |-\n    a.read\n  effect: read_only\n"
    assert renamed(text, "a.read", "a.get") == "- tool: |-\n    a.get\n  effect: read_only\n"


def test_anchors_tags_and_aliases_are_kept() -> None:
    text = (
        "- tool: &reader !!str a.read\n  effect: read_only\n"
        "- tool: a.write\n  effect: idempotent\n  requires: [*reader]\n"
    )
    assert renamed(text, "a.read", "a.get") == text.replace("a.read", "a.get")


def test_a_reference_inherited_through_a_merge_key_is_found() -> None:
    text = (
        "- tool: a.undo\n  effect: idempotent\n"
        "- tool: a.write\n  effect: compensable\n"
        "  compensation:\n    <<: &undo { tool: a.undo }\n    kind: compensation\n"
    )
    result = remove({"m.yaml": text}, ["a.undo"])
    assert [r.path for r in result.errors[0].references] == ["a.write: compensation.tool"]
    assert renamed(text, "a.undo", "a.revert") == text.replace("a.undo", "a.revert")


def test_free_text_that_mentions_a_name_is_not_a_reference() -> None:
    text = "- tool: a.read\n  effect: read_only\n  description: a.read reads; see a.read\n"
    assert renamed(text, "a.read", "a.get") == text.replace("tool: a.read", "tool: a.get")


def test_a_number_is_never_a_tool_name() -> None:
    text = "- tool: '7'\n  effect: read_only\n- tool: b\n  effect: idempotent\n  requires: [7]\n"
    assert renamed(text, "7", "seven") == text.replace("'7'", "'seven'")


def test_k8s_names_follow_the_tool_only_when_derived_from_it() -> None:
    assert k8s_name("Stripe/Create_Charge") == "stripe-create-charge"
    resource = (
        "apiVersion: unwind.dev/v1alpha1\nkind: ToolManifest\nmetadata:\n  name: {name}\n"
        "spec:\n  tool: Stripe/Refund\n  effect: idempotent\n"
    )
    derived = resource.format(name="stripe-refund")
    assert renamed(derived, "Stripe/Refund", "Stripe/Refunds") == resource.format(
        name="stripe-refunds"
    ).replace("Stripe/Refund\n", "Stripe/Refunds\n")
    chosen = resource.format(name="refunds-v1")
    assert renamed(chosen, "Stripe/Refund", "Stripe/Refunds") == chosen.replace(
        "Stripe/Refund\n", "Stripe/Refunds\n"
    )


def test_removing_the_first_of_several_documents_keeps_the_header_comment() -> None:
    text = (
        "# Payments.\n\n# the read\ntool: a.read\neffect: read_only\n---\n"
        "tool: a.write\neffect: idempotent\n"
    )
    assert removed(text, "a.read") == "# Payments.\n\n---\ntool: a.write\neffect: idempotent\n"


def test_removing_the_last_document_leaves_no_trailing_gap() -> None:
    text = "tool: a.read\neffect: read_only\n\n---\ntool: a.write\neffect: idempotent\n"
    assert removed(text, "a.write") == "tool: a.read\neffect: read_only\n"


def test_removing_from_a_flow_list_takes_the_right_comma() -> None:
    text = "[{tool: a, effect: read_only}, {tool: b, effect: read_only}, {tool: c, effect: read_only}]\n"
    assert removed(text, "a") == "[{tool: b, effect: read_only}, {tool: c, effect: read_only}]\n"
    assert removed(text, "b") == "[{tool: a, effect: read_only}, {tool: c, effect: read_only}]\n"
    assert removed(text, "c") == "[{tool: a, effect: read_only}, {tool: b, effect: read_only}]\n"
    assert removed(text, "b", "c") == "[{tool: a, effect: read_only}]\n"
    assert removed(text, "a", "b", "c") == ""


def test_removing_every_item_of_a_list_removes_its_document() -> None:
    text = "- tool: a\n  effect: read_only\n---\n# kept\n- tool: b\n  effect: read_only\n"
    assert removed(text, "a") == "---\n# kept\n- tool: b\n  effect: read_only\n"


def test_a_comment_indented_deeper_stays_with_the_item_above() -> None:
    text = (
        "- tool: a\n  effect: read_only\n  # about a's effect\n"
        "# about b\n- tool: b\n  effect: read_only\n- tool: c\n  effect: read_only\n"
    )
    assert removed(text, "b") == (
        "- tool: a\n  effect: read_only\n  # about a's effect\n- tool: c\n  effect: read_only\n"
    )


def test_a_tool_defined_twice_is_removed_and_renamed_everywhere() -> None:
    text = "- tool: a\n  effect: read_only\n- tool: b\n  effect: read_only\n- tool: a\n  effect: idempotent\n"
    assert removed(text, "a") == "- tool: b\n  effect: read_only\n"
    assert renamed(text, "a", "z") == text.replace("tool: a", "tool: z")
