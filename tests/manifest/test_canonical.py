"""Canonical JSON and checksums are stable, and normalization is idempotent."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from unwind.manifest.canonical import canonical_json, checksum
from unwind.manifest.model import ToolManifest

words = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
durations = st.one_of(st.integers(0, 10**7), st.builds(lambda n, u: f"{n}{u}", st.integers(0, 366),
                                                       st.sampled_from(["ms", "s", "m", "h", "d"])))
refs = st.one_of(words.map(lambda w: f"$args.{w}"), words.map(lambda w: f"$result.{w}?"),
                 st.builds(lambda v: {"const": v}, st.one_of(st.integers(), st.text(max_size=5))))


@st.composite
def manifests(draw: st.DrawFn) -> dict[str, Any]:
    effect = draw(st.sampled_from(["read_only", "idempotent", "reversible", "compensable", "irreversible"]))
    data: dict[str, Any] = {"tool": "t." + draw(words), "effect": effect, "permission": draw(words)}
    if draw(st.booleans()):
        data["timeout_ms"] = draw(durations)
    if draw(st.booleans()):
        data["description"] = draw(st.text(max_size=20))
    if draw(st.booleans()):
        data["owner"] = draw(st.one_of(words, st.lists(words, max_size=3)))
    if effect in ("reversible", "compensable"):
        data["compensation"] = {"tool": "undo." + draw(words),
                                "argument_map": draw(st.dictionaries(words, refs, max_size=3)),
                                "timeout_ms": draw(durations)}
    if effect in ("read_only", "idempotent") and draw(st.booleans()):
        data["retry"] = {"attempts": draw(st.integers(1, 10)), "base_ms": draw(durations)}
    if draw(st.booleans()):
        data["approval"] = draw(st.one_of(st.just("always"), st.builds(
            lambda r, q: {"roles": r, "quorum": q}, st.lists(words, min_size=1, max_size=2),
            st.integers(1, 10))))
    if draw(st.booleans()):
        data["requires"] = draw(st.lists(st.one_of(words, st.builds(lambda w: {"tool": w}, words)),
                                         max_size=3))
    return data


@settings(max_examples=200)
@given(manifests())
def test_a_normalized_manifest_survives_serialize_and_parse_unchanged(data: dict[str, Any]) -> None:
    first = ToolManifest.model_validate(data)
    text = canonical_json(first.canonical_dict())
    again = ToolManifest.model_validate(json.loads(text))
    assert again == first
    assert canonical_json(again.canonical_dict()) == text
    assert checksum(again) == checksum(first)


def test_canonical_json_sorts_keys_and_has_no_whitespace() -> None:
    assert canonical_json({"b": 1, "a": [1, {"d": "é", "c": None}]}) == '{"a":[1,{"c":null,"d":"é"}],"b":1}'.encode()


def test_the_checksum_of_a_known_manifest_is_fixed() -> None:
    # Pinned: a change here means every signature in every registry becomes invalid.
    m = ToolManifest.model_validate({"tool": "stripe.refund", "effect": "idempotent",
                                     "permission": "payments:write", "timeout_ms": "30s"})
    assert canonical_json(m.canonical_dict()) == (
        b'{"approval":{"escalate_to":[],"on_timeout":"deny","quorum":1,"required":false,"roles":[]},'
        b'"effect":"idempotent","lifecycle":"approved","owner":[],"permission":"payments:write",'
        b'"requires":[],"timeout_ms":30000,"tool":"stripe.refund","version":1}')
    assert checksum(m) == checksum(m.canonical_dict())


def test_equivalent_spellings_share_a_checksum() -> None:
    a = ToolManifest.model_validate({"tool": "t", "effect": "read_only", "permission": "p",
                                     "timeout_ms": "2s", "owner": "me", "approval": "never"})
    b = ToolManifest.model_validate({"tool": "t", "effect": "read_only", "permission": "p",
                                     "timeout_ms": 2000, "owner": ["me"]})
    assert checksum(a) == checksum(b)
