"""Properties: a rename is undone exactly by the reverse rename, and never changes meaning elsewhere."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml
from edit_helpers import before
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from unwind.edit import occurrences, rename
from unwind.edit.source import parse
from unwind.edit.text import plain_safe

CASES = [
    "rename_keeps_comments",
    "rename_in_flow_and_quoted",
    "rename_across_files",
    "rename_in_contract_tests",
    "rename_tool_manifest_resources",
]
SETS = {case: before(case) for case in CASES}
NAMES = st.from_regex(r"[A-Za-z0-9_.:/-]{1,40}", fullmatch=True)


def names_in(files: Mapping[str, str]) -> tuple[list[str], set[str]]:
    found = occurrences(parse(p, files[p]) for p in sorted(files))
    defined = sorted({o.value for o in found if o.place.role == "definition"})
    return defined, {o.value for o in found}


def loaded(files: Mapping[str, str]) -> dict[str, list[Any]]:
    return {p: list(yaml.safe_load_all(text)) for p, text in files.items()}


@st.composite
def rename_pairs(draw: st.DrawFn) -> tuple[str, str, str]:
    case = draw(st.sampled_from(CASES))
    defined, everything = names_in(SETS[case])
    old = draw(st.sampled_from(defined))
    new = draw(NAMES)
    assume(new not in everything)
    return case, old, new


@settings(max_examples=80, deadline=None)
@given(rename_pairs())
def test_renaming_a_to_b_and_back_gives_the_original_bytes(pair: tuple[str, str, str]) -> None:
    case, old, new = pair
    # A name that must be quoted turns plain scalars into quoted ones, and renaming
    # back cannot know they were plain: the byte-exact promise is for plain-safe names.
    assume(plain_safe(new))
    files = SETS[case]
    there = rename(files, old, new)
    assert there.success, there.errors
    moved = {**files, **there.files}
    back = rename(moved, new, old, base_revision=there.revision)
    assert back.success, back.errors
    assert {**moved, **back.files} == files
    assert back.revision == rename(files, old, old).revision


@settings(max_examples=80, deadline=None)
@given(rename_pairs())
def test_any_valid_new_name_reads_back_as_that_string(pair: tuple[str, str, str]) -> None:
    case, old, new = pair
    files = SETS[case]
    result = rename(files, old, new)
    assert result.success, result.errors
    moved = {**files, **result.files}
    defined, _ = names_in(moved)
    assert new in defined and old not in defined
    back = rename(moved, new, old)
    assert back.success
    assert loaded({**moved, **back.files}) == loaded(files)
