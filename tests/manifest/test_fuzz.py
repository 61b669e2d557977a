"""Fuzzed input never crashes the validator, the loader or the reference parser: every
outcome is a model or a list of issues with a path and a message."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from unwind.manifest.loader import check, load_text
from unwind.manifest.validate import validate_manifest, validate_set

FIELDS = ["tool", "effect", "permission", "approval", "compensation", "requires", "retry",
          "idempotency", "audit", "lookup", "draft", "upstream", "timeout_ms", "lifecycle",
          "owner", "risk", "version", "replaced_by", "argument_map", "verification", "deadline",
          "kind", "residue", "expect", "by", "arguments", "quorum", "roles", "key"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=False),
                    st.text(max_size=12), st.sampled_from(["read_only", "compensable", "$args.a",
                                                           "$result.b?", "$key", "30s", "always"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.sampled_from(FIELDS), inner, max_size=5)),
    max_leaves=25)
manifest_like = st.fixed_dictionaries(
    {"tool": st.text(max_size=10), "effect": st.sampled_from(["read_only", "idempotent", "reversible",
                                                              "compensable", "irreversible", "x"]),
     "permission": st.text(max_size=6)},
    optional={k: json_values for k in FIELDS if k not in ("tool", "effect", "permission")})


@settings(max_examples=400, deadline=None)
@given(st.one_of(manifest_like, json_values))
def test_any_input_gives_a_model_or_issues_never_an_exception(data: Any) -> None:
    manifest, issues = validate_manifest(data)
    assert manifest is not None or issues
    for issue in issues:
        assert isinstance(issue.path, str) and issue.message
    if manifest is not None:
        validate_set([manifest, manifest])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_loads_to_items_or_one_line_errors(text: str) -> None:
    result = check(load_text(text, "fuzz.yaml"))
    for issue in result.issues:
        assert "\n" not in issue.message
