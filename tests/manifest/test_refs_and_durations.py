"""The reference grammar and durations."""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unwind.manifest.durations import parse_duration
from unwind.manifest.refs import (
    EACH,
    Missing,
    Ref,
    RefSyntaxError,
    expected_reference,
    parse_ref,
    resolve,
    resolve_expected,
    resolve_map,
)


@pytest.mark.parametrize(("text", "ms"), [(1500, 1500), ("1500", 1500), ("500ms", 500), ("30s", 30_000),
                                          ("15m", 900_000), ("2h", 7_200_000), ("1d", 86_400_000)])
def test_durations_normalize_to_milliseconds(text: object, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("bad", ["30 sec", "1w", -5, True, "", "1.5s", None])
def test_malformed_durations_say_how_to_write_one(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_paths_take_dotted_names_and_both_index_forms() -> None:
    assert parse_ref("$result.items[0].id") == Ref("result", ("items", 0, "id"))
    assert parse_ref("$result.items.0.id") == Ref("result", ("items", 0, "id"))
    assert parse_ref("$args.note?") == Ref("args", ("note",), optional=True)
    assert parse_ref("$key") == Ref("key")
    assert parse_ref({"const": 5}) == Ref("const", value=5)


@pytest.mark.parametrize("bad", ["$args", "$args.", "$args.a..b", "$args.a[x]", "$args.*",
                                 "$result.a[?(@.x)]", "args.a", "$env.HOME", 5,
                                 {"const": 1, "x": 2}, "$args.a + 1"])
def test_anything_but_the_grammar_is_refused(bad: object) -> None:
    with pytest.raises(RefSyntaxError):
        parse_ref(bad)


def test_resolution_walks_objects_and_lists() -> None:
    result = {"items": [{"id": "x"}]}
    assert resolve(parse_ref("$result.items[0].id"), {}, result) == "x"
    missing = resolve(parse_ref("$result.items[3].id"), {}, result)
    assert isinstance(missing, Missing) and "no index 3" in missing.reason


def test_an_optional_missing_value_is_dropped_and_a_required_one_is_reported() -> None:
    values, missing = resolve_map({"a": "$args.a", "b": "$args.b?", "c": "$result.c"},
                                  {"a": 1}, {})
    assert values == {"a": 1}
    assert missing == ["c: $result has no 'c'"]


def test_the_key_resolves_only_when_sent() -> None:
    assert resolve(parse_ref("$key"), {}, {}, key="k1") == "k1"
    assert isinstance(resolve(parse_ref("$key"), {}, {}), Missing)


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,8}", fullmatch=True)


@given(st.sampled_from(["args", "result"]), st.lists(st.one_of(names, st.integers(0, 99)),
                                                     min_size=1, max_size=5), st.booleans())
def test_a_parsed_reference_prints_back_to_an_equal_reference(root: str, path: list[object],
                                                              optional: bool) -> None:
    ref = Ref(root, tuple(path), optional)  # type: ignore[arg-type]
    assert parse_ref(ref.text()) == ref


@given(st.text(max_size=30))
def test_no_string_crashes_the_parser(text: str) -> None:
    with contextlib.suppress(RefSyntaxError):
        parse_ref(text)


def test_a_manifest_duration_longer_than_a_year_is_refused_but_a_plain_duration_is_not() -> None:
    from unwind.manifest.durations import parse_manifest_duration

    assert parse_manifest_duration("366d") == 366 * 86_400_000
    with pytest.raises(ValueError, match="longer than a year"):
        parse_manifest_duration("367d")
    with pytest.raises(ValueError, match="longer than a year"):
        parse_manifest_duration(10**15)
    assert parse_duration("825d") == 825 * 86_400_000  # a certificate lifetime may be longer


@pytest.mark.parametrize(("raw", "hint"), [("$arg.id", "$args.id"), ("$results.id", "$result.id"),
                                           ("args.x[0]", "$args.x[0]"), ("$keys", "$key")])
def test_a_misspelled_root_is_answered_with_the_likely_reference(raw: str, hint: str) -> None:
    with pytest.raises(RefSyntaxError, match=re.escape(f"(did you mean {hint}?)")):
        parse_ref(raw)


def test_a_position_in_a_reference_counts_its_characters_from_one() -> None:
    with pytest.raises(RefSyntaxError, match=re.escape("after the '.' at character 9 ")):
        parse_ref("$args.id.")  # the 9th character is the last dot


# ---- list projections ([*]) ----

def test_a_projection_parses_to_one_each_segment_and_prints_back() -> None:
    ref = parse_ref("$args.entities[*].name")
    assert ref == Ref("args", ("entities", EACH, "name"))
    assert ref.projects and ref.split() == (("entities",), ("name",))
    assert ref.text() == "$args.entities[*].name"
    assert parse_ref("$result[*].id?") == Ref("result", (EACH, "id"), optional=True)
    assert not parse_ref("$args.entities[0].name").projects


@pytest.mark.parametrize(("bad", "says"), [
    ("$args.a[*", "every item of a list [*]"),
    ("$args.a[**]", "every item of a list [*]"),
    ("$args.a[ * ]", "every item of a list [*]"),
    ("$args.a.*", "expected a field name"),
    ("$args.a[*][*]", "at most one [*]"),
    ("$args.a[*].b[*].c", "at most one [*]"),
    ("$args.a[*].b[?(@.x)]", "non-negative integer"),
])
def test_a_malformed_or_nested_projection_is_refused_with_what_to_write(bad: str, says: str) -> None:
    with pytest.raises(RefSyntaxError, match=re.escape(says)):
        parse_ref(bad)


def test_a_projection_yields_the_list_of_each_items_value_in_order() -> None:
    args = {"entities": [{"name": "a", "type": "t"}, {"name": "b"}], "ids": [3, 1, 2]}
    assert resolve(parse_ref("$args.entities[*].name"), args, None) == ["a", "b"]
    assert resolve(parse_ref("$args.ids[*]"), args, None) == [3, 1, 2]
    assert resolve(parse_ref("$result[*].id"), None, [{"id": 1}, {"id": 2}]) == [1, 2]
    assert resolve(parse_ref("$args.none[*].name"), {"none": []}, None) == []


@pytest.mark.parametrize(("args", "reason"), [
    ({}, "$args has no 'entities'"),
    ({"entities": {"name": "a"}}, "$args.entities is an object, not a list"),
    ({"entities": [{"name": "a"}, {"type": "t"}]}, "$args.entities[1] has no 'name'"),
    ({"entities": [{"name": "a"}, {"name": None}]}, "$args.entities[1].name is null"),
    ({"entities": [{"name": "a"}, None]}, "$args.entities[1] has no 'name'"),
])
def test_a_projection_with_a_missing_list_or_item_is_missing_as_a_whole(
        args: dict[str, object], reason: str) -> None:
    found = resolve(parse_ref("$args.entities[*].name"), args, None)
    assert isinstance(found, Missing) and found.reason.startswith(reason)


def test_an_optional_projection_is_dropped_as_a_whole_never_in_part() -> None:
    values, missing = resolve_map({"names": "$args.e[*].name?", "all": "$args.e[*].name"},
                                  {"e": [{"name": "a"}, {}]}, None)
    assert values == {} and missing == ["all: $args.e[1] has no 'name'"]


@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=3),
                          st.fixed_dictionaries({"id": st.integers()})), max_size=6))
def test_a_projection_is_the_items_own_values_or_missing_never_a_partial_list(
        items: list[object]) -> None:
    found = resolve(parse_ref("$result.items[*].id"), None, {"items": items})
    ok = all(isinstance(i, dict) for i in items)
    if ok:
        assert found == [i["id"] for i in items]  # type: ignore[index]
    else:
        assert isinstance(found, Missing)


@given(st.sampled_from(["args", "result"]),
       st.lists(st.one_of(names, st.integers(0, 99)), max_size=3),
       st.lists(st.one_of(names, st.integers(0, 99)), max_size=3), st.booleans())
def test_a_parsed_projection_prints_back_to_an_equal_reference(
        root: str, before: list[object], after: list[object], optional: bool) -> None:
    ref = Ref(root, (*before, EACH, *after), optional)  # type: ignore[arg-type]
    assert parse_ref(ref.text()) == ref


# ---- expected values ----

@pytest.mark.parametrize(("raw", "expected"), [
    ("$args.destination", Ref("args", ("destination",))),
    ("$before.name", Ref("before", ("name",))),
    ({"const": "$5"}, Ref("const", value="$5")),
    ("cancelled", None), ({"found": False}, None), (5, None), (None, None), ([1], None),
])
def test_an_expected_value_is_a_reference_only_when_written_as_one(
        raw: object, expected: Ref | None) -> None:
    assert expected_reference(raw) == expected


def test_an_expected_text_starting_with_a_dollar_must_parse() -> None:
    with pytest.raises(RefSyntaxError, match="did you mean"):
        expected_reference("$arg.destination")


def test_expected_references_resolve_over_the_call_and_literals_stay_as_written() -> None:
    expect = {"folder": "$args.destination", "ids": "$result.moved[*].id", "state": "moved",
              "price": {"const": "$5"}}
    got, missing = resolve_expected(expect, {"destination": "archive"},
                                    {"moved": [{"id": 1}, {"id": 2}]})
    assert missing == []
    assert got == {"folder": "archive", "ids": [1, 2], "state": "moved", "price": "$5"}
    _, missing = resolve_expected({"folder": "$args.to"}, {}, {})
    assert missing == ["expect folder: $args has no 'to'"]
