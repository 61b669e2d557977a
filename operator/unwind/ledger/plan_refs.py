"""A manifest's references as the planner reads them: parsed once per plan, resolved from
an entry's handle (pure). ``$current`` references are left for the step runner, which reads
the object right before the undo (``compensation.current``)."""

from __future__ import annotations

from typing import Any

from ..manifest.model import ToolManifest
from ..manifest.refs import Missing, Ref, RefSyntaxError, expected_reference, parse_ref, resolve
from ..manifest.undo_refs import guarded_fields
from .entry import Handle
from .handle import kept_references, redacted_needs


class Compiled:
    """A manifest's references, parsed once per plan (parsing dominates a plan's time)."""

    def __init__(self, m: ToolManifest) -> None:
        c = m.compensation

        def parse(refs: dict[str, Any]) -> list[tuple[str, Ref]]:
            return [(name, parse_ref(raw)) for name, raw in refs.items()]
        self.undo = parse(c.argument_map) if c else []
        self.headers = parse(c.headers or {}) if c else []
        self.current = parse(c.current.arguments) if c and c.current else []
        self.verification = parse(c.verification.arguments) if c and c.verification else []
        self.lookup = parse(m.lookup.arguments) if m.lookup else []
        v = c.verification if c else None
        # expect: a reference ($args, $result, $before, {const}) is resolved from the handle
        # (a text that does not parse: why); any other value is a literal
        self.expect: list[tuple[str, Any, Ref | str | None]] = [
            (path, raw, expected_ref(raw)) for path, raw in (v.expect.items() if v else ())]
        self.guarded = guarded_fields(m)
        needs = [(w, r) for w, r in kept_references(m)
                 if w.startswith(("compensation.argument_map.", "compensation.headers.",
                                  "compensation.current."))]
        self.masked = "; ".join(redacted_needs(m, needs))


class Refs:
    def __init__(self) -> None:
        self._by_id: dict[int, tuple[ToolManifest, Compiled]] = {}

    def of(self, m: ToolManifest) -> Compiled:
        found = self._by_id.get(id(m))
        if found is None or found[0] is not m:
            found = self._by_id[id(m)] = (m, Compiled(m))
        return found[1]


def resolve_refs(refs: list[tuple[str, Ref]], handle: Handle,
             key: str | None) -> tuple[dict[str, Any], list[str]]:
    """As ``refs.resolve_map``, over parsed references: optional missing values are
    dropped; each required missing value adds a reason."""
    out: dict[str, Any] = {}
    missing: list[str] = []
    for name, ref in refs:
        value = resolve(ref, handle.args, handle.result, key, handle.before)
        if isinstance(value, Missing):
            if not ref.optional:
                missing.append(f"{name}: {value.reason}")
        else:
            out[name] = value
    return out, missing


def resolve_late(refs: list[tuple[str, Ref]], handle: Handle, key: str | None,
                  place: str) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """As ``_resolve``, except that a ``$current`` reference is left for the runner to fill
    from the read right before the undo: ``{place.name: reference}``."""
    late = {f"{place}.{name}": ref.text() for name, ref in refs if ref.root == "current"}
    out, missing = resolve_refs([(n, r) for n, r in refs if r.root != "current"], handle, key)
    return out, missing, late


def expected_ref(raw: Any) -> Ref | str | None:
    """An expected value's reference, None for a literal, or why it does not parse (a
    manifest version validated before expected values were parsed)."""
    try:
        return expected_reference(raw)
    except RefSyntaxError as exc:
        return str(exc)


def expected(expect: list[tuple[str, Any, Ref | str | None]], handle: Handle,
              key: str | None) -> tuple[dict[str, Any], list[str]]:
    """The verification's ``expect`` with each reference resolved from the handle; a
    literal stays as written. An expected value is never optional (the validator refuses
    ``?`` there): a missing one means the read-back cannot be built."""
    out: dict[str, Any] = {}
    missing: list[str] = []
    for path, raw, ref in expect:
        if ref is None:
            out[path] = raw
            continue
        if isinstance(ref, str):
            missing.append(f"expect {path}: {ref}")
            continue
        value = resolve(ref, handle.args, handle.result, key, handle.before)
        if isinstance(value, Missing):
            missing.append(f"expect {path}: {value.reason}")
        else:
            out[path] = value
    return out, missing
