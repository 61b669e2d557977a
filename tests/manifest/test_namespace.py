"""The set check of one namespace, lifecycles included: what the cluster would enforce."""

from __future__ import annotations

from typing import Any

from unwind.manifest.model import ToolManifest
from unwind.manifest.validate import validate_namespace, validate_set

READ = {"tool": "shop.get_order", "effect": "read_only", "permission": "shop:read"}
CANCEL = {"tool": "shop.cancel_order", "effect": "idempotent", "permission": "shop:write"}
CREATE = {"tool": "shop.create_order", "effect": "compensable", "permission": "shop:write",
          "compensation": {"tool": "shop.cancel_order", "argument_map": {"id": "$result.id"}}}


def models(*docs: dict[str, Any]) -> list[ToolManifest]:
    return [ToolManifest.model_validate(d) for d in docs]


def test_an_approved_tool_leaning_on_a_draft_is_refused_with_what_to_do() -> None:
    ms = models(CREATE, {**CANCEL, "lifecycle": "draft"})
    issues = validate_namespace(ms)
    assert [(i.tool, i.path, i.index) for i in issues] == [
        ("shop.create_order", "compensation.tool", 0)]
    assert issues[0].message == ("names 'shop.cancel_order', which has no approved version: "
                                 "approve it first")
    assert validate_set(ms) == []  # the plain set check would have passed it


def test_a_draft_may_lean_on_another_draft() -> None:
    ms = models({**CREATE, "lifecycle": "draft"}, {**CANCEL, "lifecycle": "draft"})
    assert validate_namespace(ms) == []


def test_a_draft_is_still_checked_against_everything() -> None:
    ms = models({**CREATE, "lifecycle": "draft"})
    issues = validate_namespace(ms)
    assert [(i.tool, i.path) for i in issues] == [("shop.create_order", "compensation.tool")]
    assert "has no manifest" in issues[0].message


def test_a_tool_declared_as_a_draft_and_as_approved_is_a_duplicate() -> None:
    ms = models({**READ, "lifecycle": "draft"}, READ)
    issues = validate_namespace(ms)
    assert [(i.tool, i.path, i.index) for i in issues] == [("shop.get_order", "tool", 1)]


def test_a_cycle_is_reported_once_whichever_tool_the_search_starts_from() -> None:
    a = {**READ, "tool": "a", "requires": ["b"]}
    b = {**READ, "tool": "b", "requires": ["a"]}
    c = {**READ, "tool": "0c", "requires": ["b"], "lifecycle": "draft"}
    issues = validate_namespace(models(a, b, c))
    assert [i.message for i in issues] == [
        "requires forms a cycle: a -> b -> a; break it by removing one of these requirements"]


def test_a_valid_namespace_has_no_issues() -> None:
    assert validate_namespace(models(CREATE, CANCEL, READ)) == []
