"""Tool names: one exact pattern, checked over the whole name everywhere a name is read.

A name that ends in a line break prints like the name without it, so two such tools
would look like one in every log, table and review: Python's ``$`` matches before a
trailing newline, which is why every check matches the whole string.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from unwind.manifest.model import TOOL_NAME_PATTERN
from unwind.manifest.places import EACH, READER_PLACES
from unwind.manifest.schema import manifest_json_schema
from unwind.manifest.validate import validate_manifest

READ = {"tool": "stripe.get_charge", "effect": "read_only", "permission": "payments:read"}


def issues_of(data: dict[str, Any]) -> list[tuple[str, str]]:
    _, issues = validate_manifest(data)
    return [(i.path, i.message) for i in issues]


def test_a_manifest_named_with_a_trailing_newline_is_refused_as_a_line_break() -> None:
    found = issues_of({**READ, "tool": "stripe.refund\n"})
    assert len(found) == 1 and found[0][0] == "tool", found
    assert "line break" in found[0][1] and "'stripe.refund\\n'" in found[0][1]


@pytest.mark.parametrize("name", ["stripe.refund\r", "stripe\tre", "stripe.refund\x00",
                                  "stripe.refund\u2028"])
def test_a_tool_name_with_a_control_character_says_so(name: str) -> None:
    found = issues_of({**READ, "tool": name})
    assert len(found) == 1 and found[0][0] == "tool", found
    assert "control character or line break" in found[0][1]


def test_a_reference_to_a_tool_name_with_a_trailing_newline_is_refused_where_it_is_written() -> None:
    data = {"tool": "stripe.refund", "effect": "compensable", "permission": "payments:write",
            "compensation": {"tool": "stripe.create_charge\n"}}
    found = issues_of(data)
    assert [path for path, _ in found] == ["compensation.tool"], found
    assert "line break" in found[0][1]


def test_every_place_that_names_a_tool_is_checked_for_a_well_formed_name() -> None:
    data = {"tool": "a", "effect": "compensable", "permission": "p", "lifecycle": "deprecated",
            "replaced_by": "r\n", "requires": ["q\n", {"tool": "q2 x"}],
            "compensation": {"tool": "c\n", "verification": {"tool": "v\n", "expect": {"x": 1}}},
            "lookup": {"tool": "l\n", "by": "id"},
            "draft": {"tool": "d\n", "promote": "p\n", "discard": "x\n"}}
    paths = sorted(path for path, _ in issues_of(data))
    assert paths == sorted(["replaced_by", "requires[0].tool", "requires[1].tool",
                            "compensation.tool", "compensation.verification.tool",
                            "lookup.tool", "draft.tool", "draft.promote", "draft.discard"])


def test_the_python_check_of_the_pattern_never_accepts_a_trailing_newline() -> None:
    assert re.fullmatch(TOOL_NAME_PATTERN, "stripe.refund")
    assert not re.fullmatch(TOOL_NAME_PATTERN, "stripe.refund\n")


def _at(schema: dict[str, Any], defs: dict[str, Any], field: tuple[str, ...]) -> dict[str, Any]:
    """The schema node at a places-table field, following $refs and Optional anyOfs."""
    node = schema
    for key in field:
        while "$ref" in node or "anyOf" in node:
            if "$ref" in node:
                node = defs[node["$ref"].split("/")[-1]]
            else:  # Optional[X] or a shorthand (string | object): take the object branch
                node = next(o for o in node["anyOf"] if o.get("type") != "null"
                            and ("$ref" in o or "properties" in o or o.get("type") == "array")
                            ) if len(node["anyOf"]) > 1 and key != EACH else node["anyOf"][0]
        node = node["items"] if key == EACH else node["properties"][key]
    while "anyOf" in node:  # Optional[str]: the string branch carries the pattern
        node = next(o for o in node["anyOf"] if o.get("type") == "string")
    return node


@pytest.mark.parametrize("field", [("tool",), *(p.field for p in READER_PLACES)],
                         ids=lambda f: ".".join(f))
def test_the_json_schema_gives_every_tool_name_field_the_pattern(field: tuple[str, ...]) -> None:
    schema = manifest_json_schema()
    node = _at(schema, schema.get("$defs", {}), field)
    assert node.get("type") == "string" and node.get("pattern") == TOOL_NAME_PATTERN, node


def test_the_schema_pattern_is_anchored_for_ecma_and_re2_and_has_no_python_only_escape() -> None:
    # JSON Schema (ECMA-262) and Kubernetes (Go RE2) read `$` as the end of the input when
    # no multiline flag is set; `\Z` would be a literal Z in ECMA-262 and an error in RE2.
    assert TOOL_NAME_PATTERN.startswith("^") and TOOL_NAME_PATTERN.endswith("$")
    assert "\\Z" not in TOOL_NAME_PATTERN and "\\z" not in TOOL_NAME_PATTERN
