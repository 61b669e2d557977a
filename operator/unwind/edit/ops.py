"""Rename and remove tools by name, as pure functions over `{path: text}`.

Pure so that the filesystem (`unwind manifests rename|remove`) and a future
cluster storage share one implementation and cannot drift: a storage reads the
texts, calls these, and writes `result.files` only when `result.success`.

Files holding no manifest and no contract test are set aside first (`select`);
everything below works on the rest. The checks run in a fixed order, each
refusing with nothing changed: `stale` (base revision), `parse_error`,
`not_found`, then the operation's own (`invalid_name`, `conflict`,
`has_references`), then a re-parse of the edited texts (`unrewritable`, which
means this package has a bug, never a guess), then the caller's `validator`
(`invalid`), which stays the one judge of what an edit may leave behind.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from ruamel.yaml.nodes import ScalarNode

from unwind.edit import text as t
from unwind.edit.references import Place, is_object_name, k8s_name, matches, places, text_of
from unwind.edit.result import Changes, EditError, EditResult, Location, refused, revision
from unwind.edit.select import Selection, select
from unwind.edit.source import ParsedFile, ParseError, Unit, parse, removal_ranges

# Called with the edited files' texts after the edit and before it; returns the problems
# that refuse the edit. Given both, a validator can refuse only what the edit adds.
Validator = Callable[[Mapping[str, str], Mapping[str, str]], Sequence[str]]

NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,128}$")


@dataclass(frozen=True)
class Occurrence:
    """A tool name found at one row of the reference table."""

    unit: Unit
    place: Place
    node: ScalarNode
    field: str
    value: str

    @property
    def location(self) -> Location:
        if self.unit.kind == "test_case":
            path = f"tests[{self.unit.item}].{self.field}"
        else:
            path = f"{self.unit.tool or '<unnamed>'}: {self.field}"
        return Location(self.unit.file, self.node.start_mark.line + 1, path)


def occurrences(parsed: Iterable[ParsedFile]) -> list[Occurrence]:
    """Every tool name in every reference place of every unit, in file order."""
    found: list[Occurrence] = []
    for pf in parsed:
        for unit in pf.units:
            owners = [(unit.node, places(unit.kind))]
            if unit.resource is not None:
                owners.append((unit.resource, places("resource")))
            for owner_node, rows in owners:
                for place in rows:
                    for node, field in matches(owner_node, place):
                        value = text_of(node)
                        assert value is not None
                        found.append(Occurrence(unit, place, node, field, value))
    return found


def _parse_all(files: Mapping[str, str]) -> list[ParsedFile]:
    return [parse(path, files[path]) for path in sorted(files)]


def _not_found(name: str, sel: Selection, searched: Sequence[str]) -> EditError:
    """`not_found`, naming where the caller looked (the paths it was given) when it says."""
    where = ", ".join(searched) if searched else "these files"
    count = f"{len(sel.files)} file{'s' if len(sel.files) != 1 else ''} read"
    if sel.skipped:
        count += f", {len(sel.skipped)} skipped"
    return EditError("not_found", f'no tool named "{name}" in {where} ({count})')


def _start(
    sel: Selection, base_revision: str | None
) -> tuple[list[ParsedFile], list[Occurrence]] | EditResult:
    files = sel.files
    current = revision(files)
    if base_revision is not None and base_revision != current:
        return refused(
            files,
            EditError(
                "stale",
                f"the files changed since revision {base_revision} (now {current}); "
                "reload them and try again",
            ),
        )
    if sel.broken:
        why = "; it mentions tool: or kind: ToolManifest, so it is not skipped: fix it first"
        return refused(files, *(EditError("parse_error", f"{exc}{why}") for exc in sel.broken))
    return sel.parsed, occurrences(sel.parsed)


def _skipping(sel: Selection, result: EditResult) -> EditResult:
    result.skipped = list(sel.skipped)
    return result


def _finish(
    files: Mapping[str, str],
    new_texts: Mapping[str, str],
    changes: Changes,
    validator: Validator | None,
    check: Callable[[list[Occurrence]], str | None],
) -> EditResult:
    """Re-parse, sanity-check, validate, and package a successful edit."""
    changed = {p: s for p, s in new_texts.items() if s != files[p]}
    merged = {**files, **changed}
    try:
        problem = check(occurrences(_parse_all(merged)))
    except ParseError as exc:
        problem = f"the edited text does not parse: {exc}"
    if problem is not None:
        return refused(files, EditError("unrewritable", problem))
    if validator is not None:
        messages = list(validator(merged, files))
        if messages:
            return refused(files, *(EditError("invalid", m) for m in messages))
    changes.files = sorted(changed)
    return EditResult(success=True, revision=revision(merged), changes=changes, files=changed)


def rename(
    files: Mapping[str, str],
    old: str,
    new: str,
    *,
    base_revision: str | None = None,
    validator: Validator | None = None,
    searched: Sequence[str] = (),
) -> EditResult:
    """Rename tool `old` to `new` and rewrite every reference to it, in one edit.

    Files that hold no manifest and no test are left alone and listed in `skipped`
    (`select`). `searched` names where `files` came from (the paths a person gave)."""
    sel = select(files, [old])
    return _skipping(sel, _rename(sel, old, new, base_revision, validator, searched))


def _rename(
    sel: Selection,
    old: str,
    new: str,
    base_revision: str | None,
    validator: Validator | None,
    searched: Sequence[str],
) -> EditResult:
    files = sel.files
    start = _start(sel, base_revision)
    if isinstance(start, EditResult):
        return start
    parsed, found = start
    named = [o for o in found if o.place.role != "object_name"]
    if not any(o.place.role == "definition" and o.value == old for o in named):
        return refused(files, _not_found(old, sel, searched))
    if old == new:
        return EditResult(success=True, revision=revision(files))
    if not NAME.fullmatch(new):
        return refused(
            files,
            EditError(
                "invalid_name",
                f'"{new}" is not a tool name: use 1 to 128 letters, digits and _ . : / -',
            ),
        )
    clash = [o for o in named if o.value == new]
    if clash:
        return refused(
            files,
            EditError(
                "conflict",
                f'"{new}" is already defined or referenced; renaming onto it would merge two tools',
                tuple(o.location for o in clash),
            ),
        )
    edits: dict[str, list[tuple[int, int, str]]] = {pf.path: [] for pf in parsed}
    readers: set[tuple[str, int]] = set()
    try:
        for o in found:
            text = files[o.unit.file]
            if o.place.role == "object_name":
                # follow only to a name Kubernetes accepts (a tool "_" has no derived name)
                if o.unit.tool == old and o.value == k8s_name(old) != k8s_name(new) \
                        and is_object_name(k8s_name(new)):
                    edits[o.unit.file].append(t.render(text, o.node, o.value, k8s_name(new)))
            elif o.value == old:
                edit = t.render(text, o.node, old, new)
                edits[o.unit.file].append(edit)
                if o.place.role == "reader":
                    readers.add((o.unit.file, edit[0]))
        new_texts = {path: t.splice(files[path], spans) for path, spans in edits.items()}
    except t.Unrewritable as exc:
        return refused(files, EditError("unrewritable", str(exc)))
    before = sum(1 for o in named if o.value == old)

    def check(after: list[Occurrence]) -> str | None:
        values = [o.value for o in after if o.place.role != "object_name"]
        if values.count(old) or values.count(new) != before:
            return f'after rewriting, "{old}" and "{new}" are not where they should be'
        return None

    changes = Changes(renamed=[(old, new)], rewrote=len(readers))
    return _finish(files, new_texts, changes, validator, check)


def remove(
    files: Mapping[str, str],
    tools: Sequence[str],
    *,
    base_revision: str | None = None,
    validator: Validator | None = None,
    searched: Sequence[str] = (),
) -> EditResult:
    """Remove these tools (whole list item or document each) and the test cases that call them.

    Refused with `not_found` when no file defines one of them, and with
    `has_references` while anything outside the removed set still names one of them;
    removing the readers in the same request is allowed. Files are selected as for
    `rename`.
    """
    sel = select(files, tools)
    return _skipping(sel, _remove(sel, tools, base_revision, validator, searched))


def _remove(
    sel: Selection,
    tools: Sequence[str],
    base_revision: str | None,
    validator: Validator | None,
    searched: Sequence[str],
) -> EditResult:
    files = sel.files
    start = _start(sel, base_revision)
    if isinstance(start, EditResult):
        return start
    parsed, found = start
    targets = list(dict.fromkeys(tools))
    if not targets:
        return EditResult(success=True, revision=revision(files))
    defined = {o.value for o in found if o.place.role == "definition"}
    missing = [name for name in targets if name not in defined]
    if missing:
        return refused(
            files,
            *(_not_found(n, sel, searched) for n in missing),
        )
    gone = [u for pf in parsed for u in pf.units if u.tool in targets]
    gone_ids = {id(u) for u in gone}
    errors: list[EditError] = []
    for name in targets:
        readers = sorted(
            {
                o.location
                for o in found
                if o.place.role == "reader" and o.value == name and id(o.unit) not in gone_ids
            },
            key=lambda loc: (loc.file, loc.line, loc.path),
        )
        if readers:
            count = f"{len(readers)} place{'s' if len(readers) != 1 else ''}"
            message = f'tool "{name}" is read in {count}; edit or remove them first'
            errors.append(EditError("has_references", message, tuple(readers)))
    if errors:
        return refused(files, *errors)
    new_texts: dict[str, str] = {}
    try:
        for pf in parsed:
            units = [u for u in pf.units if id(u) in gone_ids]
            if units:
                new_texts[pf.path] = t.cut(pf.text, removal_ranges(pf, units))
    except t.Unrewritable as exc:
        return refused(files, EditError("unrewritable", str(exc)))
    removed = list(targets)
    removed += [f'test case "{u.case_name}" in {u.file}' for u in gone if u.kind == "test_case"]

    def check(after: list[Occurrence]) -> str | None:
        left = [o.value for o in after if o.value in targets and o.place.role != "object_name"]
        return f"after cutting, {sorted(set(left))} still appear" if left else None

    return _finish(files, new_texts, Changes(removed=removed), validator, check)
