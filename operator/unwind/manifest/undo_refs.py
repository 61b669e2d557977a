"""The values an undo needs, and whether redaction masks one of them (pure).

A ledger entry keeps only the values that the compensation's argument map, headers,
object key, read before the undo (``current``) and verification, its deadline, the lookup
and a draft's handle name (``$current`` values are read at undo time, never kept). With a ``capture``, it
also keeps the captured values those places (and the verification's ``expect``) read as
``$before.<path>``, and the call's answer at each ``expect`` path (``$result.<path>``,
what the call left there: the undo compares it with the current state before restoring). ``audit.redaction``
masks values in the ledger; a masked value that an undo needs makes that undo unavailable.
The gateway uses this when it records an entry, and lint (L036) when a manifest is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from .model import ToolManifest
from .refs import (
    EACH,
    Ref,
    RefSyntaxError,
    Segment,
    answer_path,
    expected_reference,
    parse_ref,
)


def kept_references(m: ToolManifest, *, staged: bool = False) -> Iterator[tuple[str, Ref]]:
    """(where, reference) for every value a handle must keep."""
    c = m.compensation
    places: list[tuple[str, Any]] = []
    if c is not None:
        places += [(f"compensation.argument_map.{k}", v) for k, v in c.argument_map.items()]
        if c.verification is not None:
            places += [(f"compensation.verification.arguments.{k}", v)
                       for k, v in c.verification.arguments.items()]
        if c.deadline is not None and c.deadline.at is not None:
            places.append(("compensation.deadline.at", c.deadline.at))
        places += [(f"compensation.headers.{k}", v) for k, v in (c.headers or {}).items()]
        places += [(f"compensation.object[{i}]", v) for i, v in enumerate(c.object or [])]
        if c.current is not None:
            places += [(f"compensation.current.arguments.{k}", v)
                       for k, v in c.current.arguments.items()]
    if m.lookup is not None:
        places += [(f"lookup.arguments.{k}", v) for k, v in m.lookup.arguments.items()]
    if staged and m.draft is not None:
        places += [(f"draft.handle.{k}", v) for k, v in m.draft.handle.items()]
    for where, raw in places:
        try:
            ref = parse_ref(raw)
        except RefSyntaxError:
            continue  # the validator refuses such a manifest before it is served
        if ref.root in ("args", "result", "before"):
            yield where, ref
    yield from expect_before_references(m)
    yield from expected_references(m)
    yield from (("compensation.verification.expect." + path, ref)
                for path, ref in guarded_fields(m))


def expected_references(m: ToolManifest) -> Iterator[tuple[str, Ref]]:
    """(where, reference) for each ``verification.expect`` value that reads the call
    (``$args.<path>``, ``$result.<path>``): the read-back expects what the call named.
    (``$before`` values: ``expect_before_references``.)"""
    v = m.compensation.verification if m.compensation else None
    for path, raw in (v.expect.items() if v is not None else ()):
        try:
            ref = expected_reference(raw)
        except RefSyntaxError:
            continue  # the validator refuses such a manifest before it is served
        if ref is not None and ref.root in ("args", "result"):
            yield f"compensation.verification.expect.{path}", ref


def expect_before_references(m: ToolManifest) -> Iterator[tuple[str, Ref]]:
    """(where, reference) for each ``verification.expect`` value written ``$before.<path>``:
    the undo expects the captured value back."""
    v = m.compensation.verification if m.compensation else None
    for path, raw in (v.expect.items() if v is not None else ()):
        ref = before_reference(raw)
        if ref is not None:
            yield f"compensation.verification.expect.{path}", ref


def before_reference(raw: Any) -> Ref | None:
    """``raw`` as a ``$before`` reference when it is written as one (else None: a literal)."""
    if not isinstance(raw, str) or not raw.strip().startswith("$before"):
        return None
    try:
        ref = parse_ref(raw)
    except RefSyntaxError:
        return None
    return ref if ref.root == "before" else None


def guarded_fields(m: ToolManifest) -> list[tuple[str, Ref]]:
    """The fields a call with a ``capture`` sets, as its verification's ``expect`` paths,
    each with the optional ``$result`` reference to what the call left there. Before an
    undo restores them it reads the current state and stops (``diverged``) when one no
    longer holds what the call left. Empty without a capture or a verification."""
    v = m.compensation.verification if m.compensation else None
    if m.capture is None or v is None:
        return []
    out = []
    for path in v.expect:
        try:
            ref = answer_path(path)
        except RefSyntaxError:
            continue
        out.append((path, Ref(root="result", path=ref.path, optional=True)))
    return out


def redaction_references(m: ToolManifest) -> list[Ref]:
    out = []
    for raw in m.audit.redaction if m.audit else []:
        try:
            out.append(parse_ref(raw))
        except RefSyntaxError:
            continue
    return out


def _same_place(a: Segment, b: Segment) -> bool:
    """Two segments that can name the same place: equal, or ``[*]`` and any index."""
    if a is EACH or b is EACH:
        return (a is EACH or isinstance(a, int)) and (b is EACH or isinstance(b, int))
    return a == b


def covers(outer: tuple[Segment, ...], inner: tuple[Segment, ...]) -> bool:
    """``inner`` lies inside ``outer`` (or is it) for some item a ``[*]`` stands for."""
    return len(outer) <= len(inner) and all(map(_same_place, outer, inner))


def overlaps(a: Ref, b: Ref) -> bool:
    """One path lies inside the other (or they are equal), on the same root; ``[*]``
    stands for every index."""
    return a.root == b.root and (covers(a.path, b.path) or covers(b.path, a.path))


def redacted_needs(m: ToolManifest, refs: Iterable[tuple[str, Ref]]) -> list[str]:
    """Sentences naming each kept reference that audit.redaction masks (in whole or part)."""
    masked = redaction_references(m)
    return [f"{where} reads {ref.text()}, which audit.redaction masks in the ledger"
            for where, ref in refs if any(overlaps(ref, r) for r in masked)]


