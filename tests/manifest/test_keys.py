"""Idempotency key rendering: a key is rendered from plain call arguments or the call is
refused; it is never rendered from a guess."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unwind.manifest.keys import KeyRenderError, placeholders, render_key


def refusal(template: str, args: dict[str, Any]) -> str:
    with pytest.raises(KeyRenderError) as info:
        render_key(template, args)
    assert str(info.value) == info.value.reason
    return info.value.reason


def test_a_string_argument_is_inserted_as_written() -> None:
    assert render_key("charge-{{args.order_id}}", {"order_id": "o1"}) == "charge-o1"


def test_spaces_inside_the_braces_are_allowed() -> None:
    assert render_key("charge-{{ args.order_id }}", {"order_id": "o1"}) == "charge-o1"


def test_several_placeholders_nested_paths_and_list_indices_render() -> None:
    args = {"repo": {"owner": "octo", "name": "hello"}, "labels": ["bug", "p1"]}
    key = render_key("{{args.repo.owner}}/{{args.repo.name}}#{{args.labels.1}}", args)
    assert key == "octo/hello#p1"


def test_numbers_and_bools_render_as_their_json_text() -> None:
    args = {"n": 2500, "x": 2.5, "yes": True, "no": False}
    assert render_key("{{args.n}}|{{args.x}}|{{args.yes}}|{{args.no}}", args) == "2500|2.5|true|false"


def test_a_missing_argument_refuses_the_call_and_names_it() -> None:
    reason = refusal("charge-{{args.order_id}}", {"amount": 1})
    assert "{{args.order_id}}" in reason
    assert "$args has no 'order_id'" in reason
    assert "refused" in reason


def test_a_missing_nested_argument_names_the_part_that_is_absent() -> None:
    reason = refusal("{{args.repo.owner}}", {"repo": {"name": "hello"}})
    assert "$args.repo has no 'owner'" in reason


def test_a_null_argument_is_refused() -> None:
    assert "is null" in refusal("charge-{{args.order_id}}", {"order_id": None})


def test_an_object_argument_is_refused_as_not_plain() -> None:
    reason = refusal("charge-{{args.order}}", {"order": {"id": "o1"}})
    assert "string, number or bool" in reason
    assert "an object" in reason


def test_a_list_argument_is_refused_as_not_plain() -> None:
    assert "a list" in refusal("k-{{args.ids}}", {"ids": ["a", "b"]})


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_number_is_refused(value: float) -> None:
    assert "non-finite" in refusal("k-{{args.x}}", {"x": value})


def test_a_placeholder_that_is_not_a_call_argument_is_refused() -> None:
    reason = refusal("k-{{args.a}}-{{run.id}}", {"a": "x"})
    assert "{{run.id}} is not a call argument" in reason


def test_an_optional_marker_is_not_allowed_in_a_key() -> None:
    assert "not a call argument" in refusal("k-{{args.a?}}", {"a": "x"})


def test_a_template_without_any_argument_is_refused() -> None:
    assert "names no {{args.<field>}}" in refusal("always-the-same", {"a": 1})


def test_placeholders_lists_the_text_inside_each_pair_of_braces() -> None:
    assert placeholders("{{args.a}}-{{ args.b.c }}-{{x}}") == ["args.a", "args.b.c", "x"]


plain_values = st.one_of(
    st.text(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
)
field_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True)


@given(st.dictionaries(field_names, plain_values, min_size=1))
def test_any_plain_arguments_render_deterministically(args: dict[str, Any]) -> None:
    template = "k:" + ":".join("{{args." + name + "}}" for name in sorted(args))
    first = render_key(template, args)
    assert render_key(template, dict(reversed(list(args.items())))) == first
    assert render_key(template, {**args, "not-a-key-field": {"nested": [1]}}) == first


@st.composite
def two_distinct_values_of_one_type(draw: st.DrawFn) -> tuple[Any, Any]:
    strategy = draw(st.sampled_from([
        st.text(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
        st.booleans(),
    ]))
    a = draw(strategy)
    b = draw(strategy.filter(lambda v: v != a or str(v) != str(a)))
    return a, b


@given(two_distinct_values_of_one_type())
def test_distinct_values_give_distinct_keys(pair: tuple[Any, Any]) -> None:
    a, b = pair
    template = "order-{{args.id}}-v1"
    assert render_key(template, {"id": a}) != render_key(template, {"id": b})
