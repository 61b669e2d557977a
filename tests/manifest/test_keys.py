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


def test_charging_order_42_then_42_0_renders_one_key_so_the_second_is_a_duplicate() -> None:
    # The shipped stripe.create_charge keys on {{args.order_id}}: 42.0 rendered "42.0" and
    # the same order was charged twice.
    template = "charge-{{args.order_id}}"
    assert render_key(template, {"order_id": 42.0}) == render_key(template, {"order_id": 42})
    assert render_key(template, {"order_id": 42.0}) == "charge-42"
    assert render_key(template, {"order_id": "42"}) == "charge-42"


@pytest.mark.parametrize(("value", "text"), [
    (42, "42"), (42.0, "42"), (-7.0, "-7"), (0, "0"), (0.0, "0"), (-0.0, "0"),
    (1e20, "100000000000000000000"), (10**20, "100000000000000000000"),
    (1e300, "1" + "0" * 300), (2.5, "2.5"), (0.1, "0.1"), (-0.5, "-0.5"), (1e-07, "1e-07"),
])
def test_each_number_renders_as_its_one_canonical_text(value: float, text: str) -> None:
    assert render_key("{{args.n}}", {"n": value}) == text


def test_an_integer_too_long_to_write_out_is_refused() -> None:
    assert "too long" in refusal("k-{{args.n}}", {"n": 10**5000})


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
    b = draw(strategy.filter(lambda v: v != a))
    return a, b


@given(two_distinct_values_of_one_type())
def test_distinct_values_give_distinct_keys(pair: tuple[Any, Any]) -> None:
    a, b = pair
    template = "order-{{args.id}}-v1"
    assert render_key(template, {"id": a}) != render_key(template, {"id": b})


# Integers a float can hold exactly, and any finite float: within these, JSON's equality and
# Python's agree (past 2**53 the integer 10**300 and the float 1e300 are one JSON number
# but not equal in Python; both render "1" and 300 zeros, the safe side).
numbers = st.one_of(st.integers(min_value=-(2**53), max_value=2**53),
                    st.floats(allow_nan=False, allow_infinity=False))


@given(numbers, numbers)
def test_equal_numbers_give_equal_keys_and_unequal_ones_distinct_keys(a: float, b: float) -> None:
    template = "order-{{args.id}}"
    same = render_key(template, {"id": a}) == render_key(template, {"id": b})
    assert same == (a == b)


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_a_float_renders_like_the_same_number_sent_as_json_text(x: float) -> None:
    # the agent may send repr(x), its JSON text or an integer literal: one key for all
    import json
    again = json.loads(json.dumps(x))
    assert render_key("{{args.id}}", {"id": again}) == render_key("{{args.id}}", {"id": x})
    if x.is_integer():
        literal = json.loads(render_key("{{args.id}}", {"id": x}))
        assert render_key("{{args.id}}", {"id": literal}) == render_key("{{args.id}}", {"id": x})


@given(st.integers(min_value=-(2**53), max_value=2**53))
def test_an_integral_float_renders_like_its_integer(n: int) -> None:
    assert render_key("{{args.id}}", {"id": float(n)}) == render_key("{{args.id}}", {"id": n})
