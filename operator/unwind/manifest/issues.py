"""Validation issues, and the translation of pydantic's errors into sentences a person can
act on (the field path, what is wrong, what to write instead)."""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass, field, replace
from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError


@dataclass(frozen=True)
class Issue:
    """One validation error: which tool, which field, what to fix, and where it was read."""

    tool: str | None
    path: str
    message: str
    file: str | None = None
    line: int | None = None
    # For set-level issues: the position of the manifest in the checked sequence (to locate
    # it when two share a tool name), and the tool a missing reference names.
    index: int | None = field(default=None, compare=False, repr=False)
    ref: str | None = field(default=None, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return {"tool": self.tool, "path": self.path, "message": self.message,
                "file": self.file, "line": self.line}

    def located(self, file: str | None, line: int | None) -> Issue:
        return replace(self, file=file, line=line)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file and self.line else (
            f"{self.file}: " if self.file else "")
        who = f"{self.tool}: " if self.tool else ""
        field = f"{self.path}: " if self.path else ""
        return f"{where}{who}{field}{self.message}"


def format_path(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + part
    return out


def input_path(data: Any, loc: tuple[int | str, ...]) -> tuple[str | int, ...]:
    """Keep the parts of pydantic's loc that name places in the input; drop union branch
    names (``str``, ``HeaderValue``) that pydantic inserts."""
    path: list[str | int] = []
    current = data
    for part in loc:
        if isinstance(current, dict) and part in current:  # noqa: SIM114 - separate for mypy narrowing
            current = current[part]
            path.append(part)
        elif isinstance(current, list) and isinstance(part, int) and part < len(current):
            current = current[part]
            path.append(part)
        elif isinstance(part, str) and (part in _BRANCH_NAMES or "[" in part or part[:1].isupper()):
            continue  # the name of a union branch or validator, not a place in the input
        else:
            path.append(part)
            current = None
    return tuple(path)


def without_paths(data: Any, paths: set[tuple[str | int, ...]]) -> Any:
    """A deep copy of ``data`` with the values at ``paths`` removed (list items by index,
    highest first, so removing one does not shift another)."""
    out = copy.deepcopy(data)
    order = sorted(paths, key=lambda p: [(0, x) if isinstance(x, int) else (1, x) for x in p], reverse=True)
    for path in order:
        if not path:
            continue
        parent = out
        for part in path[:-1]:
            parent = parent.get(part) if isinstance(parent, dict) else (
                parent[part] if isinstance(parent, list) and isinstance(part, int) and part < len(parent) else None)
        last = path[-1]
        if isinstance(parent, dict):
            parent.pop(last, None)
        elif isinstance(parent, list) and isinstance(last, int) and last < len(parent):
            del parent[last]
    return out


_BRANCH_NAMES = {"str", "int", "float", "bool", "list", "dict", "none", "literal"}
# Fields people bring from other formats, and what this one calls them (at the top level).
_RENAMED = {"status": "lifecycle: draft, approved or deprecated (status belongs to Kubernetes)"}


def _unknown_field(loc: tuple[str | int, ...], known: list[str], model: type[BaseModel]) -> str:
    """Why a field is unknown, and the likely fix: a field one indentation step away (written
    too deep, or beside the block it belongs in: say where to move it), a spelling mistake
    (the closest name this level has), or neither (the names this level takes).

    Only a move an indentation change can make is suggested: a field of an enclosing level,
    or of a block directly inside this one. ``upstream.mcp.name`` is not told that ``name``
    "belongs under" some unrelated block that happens to have a field of that name."""
    name = str(loc[-1]) if loc else "?"
    parent = tuple(p for p in loc[:-1] if isinstance(p, str))
    if not parent and name in _RENAMED:
        return f"unknown field {name!r}: write {_RENAMED[name]}"
    places = sorted({p for p in _field_places(model).get(name, [])
                     if p != parent and (parent[:len(p)] == p or p[:-1] == parent)})
    if places:
        under = [".".join(p) for p in places if p]
        shown = ", ".join(under[:3]) + (f" (or {len(under) - 3} more places)" if len(under) > 3 else "")
        where = " or ".join(([f"under {shown}"] if under else [])
                            + (["at the top level of the manifest"] if () in places else []))
        return (f"unknown field {name!r} here: {name} belongs {where}; move it there (check "
                "its indentation), or remove it")
    here = _model_at(model, parent)
    local = sorted(here.model_fields) if here is not None else known
    close = difflib.get_close_matches(name, local, n=1)
    if close and close[0] != name:
        return f"unknown field {name!r} (did you mean {close[0]!r}?): remove it or fix its spelling"
    takes = (f" ({'.'.join(parent)} takes: {', '.join(local)})"
             if here is not None and parent and len(local) <= 10 else "")
    return f"unknown field {name!r}: remove it or fix its spelling{takes}"


def _is_mapping(annotation: Any) -> bool:
    """A field whose value is a mapping of free keys (``headers``): its keys are not fields."""
    if get_origin(annotation) is dict:
        return True
    return any(_is_mapping(arg) for arg in get_args(annotation))


def _model_at(model: type[BaseModel], parent: tuple[str, ...]) -> type[BaseModel] | None:
    """The model of the block at ``parent`` (free mapping keys skipped), or None."""
    current: type[BaseModel] | None = model
    free_key = False
    for seg in parent:
        if current is not None and seg in current.model_fields:
            annotation = current.model_fields[seg].annotation
            subs = _model_args(annotation)
            current, free_key = (subs[0] if subs else None), _is_mapping(annotation)
        elif free_key:
            free_key = False  # a key of the mapping (a header's name)
        else:
            return None
    return None if free_key else current


def _field_places(model: type[BaseModel]) -> dict[str, list[tuple[str, ...]]]:
    """Field name -> the parent paths where a field of that name is allowed (not counting
    the fields of values inside free mappings such as ``headers``)."""
    cached = _PLACES.get(model)
    if cached is not None:
        return cached
    places: dict[str, list[tuple[str, ...]]] = {}
    todo: list[tuple[type[BaseModel], tuple[str, ...]]] = [(model, ())]
    seen: set[type[BaseModel]] = set()
    while todo:
        current, path = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, info in current.model_fields.items():
            places.setdefault(name, []).append(path)
            if not _is_mapping(info.annotation):
                todo.extend((sub, (*path, name)) for sub in _model_args(info.annotation))
    _PLACES[model] = places
    return places


_PLACES: dict[type[BaseModel], dict[str, list[tuple[str, ...]]]] = {}


def _all_field_names(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> set[str]:
    seen = seen if seen is not None else set()
    if model in seen:
        return set()
    seen.add(model)
    names = set(model.model_fields)
    for info in model.model_fields.values():
        for arg in _model_args(info.annotation):
            names |= _all_field_names(arg, seen)
    return names


def _model_args(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in get_args(annotation):
        out.extend(_model_args(arg))
    return out


def issues_from_validation_error(
    error: ValidationError, data: Any, tool: str | None, model: type[BaseModel]
) -> list[Issue]:
    known = sorted(_all_field_names(model))
    issues: list[Issue] = []
    seen: set[tuple[str, str]] = set()
    errors = [(input_path(data, tuple(e["loc"])), e) for e in error.errors(include_url=False)]
    # In a union, the branch the input did not mean reports a type error at the same place
    # where the branch it meant reports something deeper; keep only the deeper one.
    deeper = {loc[:n] for loc, _ in errors for n in range(len(loc))}
    for loc, err in errors:
        if err["type"].endswith("_type") and loc in deeper:
            continue
        kind = err["type"]
        value = err.get("input")
        if kind == "extra_forbidden":
            message = _unknown_field(loc, known, model)
        elif kind == "missing":
            message = "is required: add it"
        elif kind.startswith("value_error") or kind == "assertion_error":
            message = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
        else:
            text = str(err["msg"])
            message = text[:1].lower() + text[1:] + f" (got {value!r})"
        path = format_path(loc)
        if (path, message) in seen:
            continue
        seen.add((path, message))
        issues.append(Issue(tool=tool, path=path, message=message))
    return issues
