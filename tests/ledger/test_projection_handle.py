"""A projection resolved over the handle finds exactly what it found over the call."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from unwind.ledger.entry import Handle
from unwind.ledger.handle import build_handle
from unwind.manifest.model import ToolManifest
from unwind.manifest.refs import Missing, parse_ref, resolve

REFS = {"names": "$args.entities[*].name", "types": "$args.entities[*].kind?",
        "first": "$args.entities[0].name?", "ids": "$result[*].id"}
M = ToolManifest.model_validate({
    "tool": "memory.create_entities", "effect": "compensable", "permission": "p:w",
    "compensation": {"tool": "memory.delete_entities", "argument_map": REFS}})

leaf = st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3), st.booleans())
item = st.one_of(leaf, st.dictionaries(st.sampled_from(["name", "kind", "id", "x"]), leaf,
                                       max_size=3))
items = st.one_of(leaf, st.lists(item, max_size=5))


def same_outcome(a: Any, b: Any) -> bool:
    return (isinstance(a, Missing) and isinstance(b, Missing)) or a == b


@settings(max_examples=300)
@given(items, items)
def test_every_reference_resolves_over_the_stored_handle_as_over_the_call(
        entities: Any, result: Any) -> None:
    args = {"entities": entities}
    stored = Handle.model_validate_json(build_handle(M, args, result).model_dump_json())
    for raw in REFS.values():
        ref = parse_ref(raw)
        assert same_outcome(resolve(ref, stored.args, stored.result),
                            resolve(ref, args, result)), raw
