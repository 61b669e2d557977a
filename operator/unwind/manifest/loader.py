"""Reading manifests from files and folders, and telling them from everything else.

A YAML or JSON file holds one or more documents; each document is sorted by its content:

- a bare manifest (a mapping with ``tool``, ``effect`` or ``permission``), or a list of them;
- a Kubernetes resource ``kind: ToolManifest`` (the manifest in ``spec``), or a ``kind:
  List`` of resources; its namespace is ``metadata.namespace``, else the default given
  (kubectl's ``default`` unless told otherwise);
- contract test cases, another Kubernetes object (a Namespace, RBAC for agents...) or
  something else: not a manifest, so listed as a ``Skip`` with the reason, never judged
  as a manifest and never silently dropped;
- a ``kind`` that looks like ``ToolManifest`` but is not (``ToolManifst``, or an
  ``unwind.dev`` kind Unwind does not have): an error, because a typo there would
  otherwise turn a manifest into something nobody checks.

Every problem of a file is reported in one run: a YAML syntax error in one document does
not hide the others (the file is read again document by document), and a key given twice
in a mapping is an error (YAML would silently keep the last one). Parsing keeps each
document's node tree so that an error can name the line of the exact field it is about.

Manifests are checked one by one, then as sets: the bare manifests together, and the
resources of each namespace together (``validate_namespace``), as the cluster does.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from .. import API_GROUP, API_VERSION
from ..workspace.classify import classify_path, is_helm_template
from ..workspace.walk import expand
from .issues import Issue
from .model import ToolManifest
from .validate import validate_manifest, validate_namespace

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
RESOURCE_API_VERSION = f"{API_GROUP}/{API_VERSION}"
SUFFIXES = (".yaml", ".yml", ".json")
STDIN = "-"
STDIN_NAME = "<stdin>"
DEFAULT_NAMESPACE = "default"
UNWIND_KINDS = ("ToolManifest", "EffectLedger", "Approval")
# A mapping holding one of these (or a near miss) is meant as a manifest: the validator
# judges it, so a misspelled manifest is reported, not skipped.
_MANIFEST_KEYS = ("tool", "effect", "permission")
_DOCUMENT_START = re.compile(r"^---(?:[ \t]|$)")


@dataclass(frozen=True)
class Skip:
    """Something read that is not a manifest: where, what (``kind``) and why it was left."""

    file: str | None
    line: int | None
    kind: str  # kubernetes, contract_test, config, registry, helm, link, empty, other
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "kind": self.kind, "reason": self.reason}

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.file and self.line else (self.file or "")
        return f"{where}: {self.reason}" if where else self.reason


@dataclass
class Sourced:
    """One manifest as read: its raw mapping and where it came from."""

    data: Any
    file: str | None = None
    node: yaml.Node | None = None
    resource_name: str | None = None  # metadata.name for a ToolManifest resource
    namespace: str | None = None  # None: a bare manifest (no namespace)
    annotations: dict[str, str] = field(default_factory=dict)  # metadata.annotations
    annotation_lines: dict[str, int] = field(default_factory=dict)  # and the line of each
    key_line: int | None = None  # the line of the key that holds the manifest (``spec:``)
    todos: list[tuple[str, str]] = field(default_factory=list)  # (field path, text) of # TODO comments

    @property
    def line(self) -> int | None:
        if self.key_line is not None:
            return self.key_line
        return self.node.start_mark.line + 1 if self.node is not None else None

    def line_of(self, path: str) -> int | None:
        """The line of the field at ``path`` (or of its closest existing parent). For a
        field in a mapping this is the line of its key, also when its value is a block
        that starts on the next line."""
        node = self.node
        if node is None:
            return None
        line = self.line
        for seg in _split_path(path):
            if isinstance(node, yaml.SequenceNode) and isinstance(seg, int) and seg < len(node.value):
                child: yaml.Node | None = node.value[seg]
                key: yaml.Node | None = child
            else:
                key, child = _entry(node, str(seg))
            if child is None or key is None:
                break
            node = child
            line = key.start_mark.line + 1
        return line


@dataclass
class LoadResult:
    items: list[Sourced] = field(default_factory=list)
    errors: list[Issue] = field(default_factory=list)
    skipped: list[Skip] = field(default_factory=list)
    files: int = 0  # files read

    def extend(self, other: LoadResult) -> None:
        self.items.extend(other.items)
        self.errors.extend(other.errors)
        self.skipped.extend(other.skipped)
        self.files += other.files


@dataclass
class CheckResult:
    manifests: list[ToolManifest]
    sources: list[Sourced]
    issues: list[Issue]
    skipped: list[Skip] = field(default_factory=list)
    files: int = 0
    read: int = 0  # manifests read, valid or not

    @property
    def ok(self) -> bool:
        return not self.issues

    def namespaces(self) -> dict[str | None, list[int]]:
        """Namespace (None for bare manifests) -> positions in ``manifests``, in order."""
        out: dict[str | None, list[int]] = {}
        for i, src in enumerate(self.sources):
            out.setdefault(src.namespace, []).append(i)
        return out


_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _split_path(path: str) -> list[str | int]:
    return [name if name else int(index) for name, index in _SEGMENT.findall(path)]


def expand_paths(paths: Iterable[str | os.PathLike[str]],
                 suffixes: tuple[str, ...] = SUFFIXES) -> tuple[list[Path], list[Issue]]:
    """Files as given, and every file with one of ``suffixes`` under each folder (as git
    sees the tree: hidden and .gitignored names skipped); a path that does not exist is an
    error."""
    walked = expand(paths, suffixes)
    return walked.files, [Issue(None, "", "no such file or folder", file=str(p)) for p in walked.missing]


def load_paths(paths: Sequence[str | os.PathLike[str]],
               namespace: str = DEFAULT_NAMESPACE) -> LoadResult:
    """Every manifest under ``paths`` (``-`` reads standard input), with every error and
    every file or document that was not a manifest (``skipped``)."""
    stdin = any(os.fspath(p) == STDIN for p in paths)
    walked = expand([p for p in paths if os.fspath(p) != STDIN], SUFFIXES)
    result = LoadResult(errors=[Issue(None, "", "no such file or folder", file=str(p))
                                for p in walked.missing])
    result.skipped += [Skip(str(p), None, "link", "a symbolic link to a folder: not followed "
                            "(name the folder it points to)") for p in walked.links]
    if stdin:
        result.extend(load_text(sys.stdin.read(), STDIN_NAME, namespace))
    for path in walked.files:
        kind = classify_path(path)
        if kind.kind != "content":
            result.skipped.append(Skip(str(path), None, kind.kind, kind.reason))
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            result.errors.append(Issue(None, "", f"cannot read the file: {exc}", file=str(path)))
            continue
        result.extend(load_text(text, str(path), namespace))
    return result


def parse_documents(text: str, file: str | None) -> Iterator[tuple[yaml.Node, Any]]:
    """Yield (node, value) per document; raises yaml.YAMLError on a syntax error."""
    loader = _Loader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            yield node, loader.construct_document(node)
    finally:
        loader.dispose()


def syntax_issue(exc: yaml.YAMLError, file: str | None, text: str | None = None) -> Issue:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    line = mark.line + 1 if mark is not None else None
    hint = _flow_reference_hint(exc, text)
    if hint is not None:
        return Issue(None, "", hint, file=file, line=line)
    return Issue(None, "", f"YAML syntax error: {problem}", file=file, line=line)


# A reference ending right where a flow collection met a '[' it read as a list's start.
_CUT_REFERENCE = re.compile(r"([\w-]+\s*:\s*)?(\$(?:args|result|before|key)[\w.\-\[\]*?]*)$")
_REFERENCE_REST = re.compile(r"(?:[\w.\-*?]|\[[^\]\s,{}]*\])*")


def _flow_reference_hint(exc: yaml.YAMLError, text: str | None) -> str | None:
    """A reference with ``[n]`` or ``[*]`` written unquoted inside a flow mapping or list
    (``{id: $result.items[0].id}``): YAML reads the ``[`` as the start of a list, so the
    line fails to parse (or, in other YAML readers, becomes a list). Say to quote it."""
    mark = getattr(exc, "problem_mark", None)
    problem = str(getattr(exc, "problem", "") or "")
    if text is None or mark is None or "expected ','" not in problem:
        return None
    lines = text.splitlines()
    if not 0 <= mark.line < len(lines):
        return None
    row = lines[mark.line]
    if row[mark.column:mark.column + 1] != "[":
        return None
    cut = _CUT_REFERENCE.search(row[:mark.column])
    if cut is None:
        return None
    rest = _REFERENCE_REST.match(row, mark.column)
    ref = cut.group(2) + (rest.group(0) if rest else "")
    key = (cut.group(1) or "").strip()
    written = f'{key} "{ref}"' if key else f'"{ref}"'
    return (f"YAML syntax error: the reference {ref} is unquoted inside a flow mapping or list "
            "({...} or [...]), where YAML reads its '[' as the start of a list: quote it "
            f"({written}), or write the mapping in block style")


def documents(text: str, file: str | None) -> Iterator[tuple[yaml.Node, Any] | Issue]:
    """Each document of ``text`` as (node, value), or an Issue for one that does not parse.
    The file is parsed whole first (the usual case); only when that fails is it split at
    its ``---`` lines and each part parsed alone, so one broken document does not hide the
    problems of the others. Line numbers stay those of the file."""
    try:
        parsed = list(parse_documents(text, file))
    except yaml.YAMLError as exc:
        parts = _split_documents(text)
        if len(parts) < 2:
            yield syntax_issue(exc, file, text)
            return
        for start, part in parts:
            try:
                yield from parse_documents("\n" * start + part, file)
            except yaml.YAMLError as part_exc:
                yield syntax_issue(part_exc, file, "\n" * start + part)
        return
    yield from parsed


def _split_documents(text: str) -> list[tuple[int, str]]:
    """(first line index, text) of each ``---``-separated part of ``text``."""
    parts: list[tuple[int, list[str]]] = [(0, [])]
    for number, line in enumerate(text.splitlines(keepends=True)):
        if _DOCUMENT_START.match(line) and parts[-1][1]:
            parts.append((number, []))
        parts[-1][1].append(line)
    return [(start, "".join(lines)) for start, lines in parts if "".join(lines).strip()]


def duplicate_keys(node: yaml.Node, file: str | None) -> list[Issue]:
    """A key given twice in one mapping: YAML keeps the last value without a word, so the
    first one, which a reviewer may have read, would silently not count."""
    issues: list[Issue] = []
    seen: set[int] = set()  # aliases may share nodes, even recursively
    todo: list[tuple[yaml.Node, str]] = [(node, "")]
    while todo:
        current, path = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, yaml.MappingNode):
            first: dict[str, yaml.Node] = {}
            for key, value in current.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name is None or key.tag == "tag:yaml.org,2002:merge":
                    continue
                here = f"{path}.{name}" if path else name
                if name in first:
                    issues.append(Issue(None, here, (
                        f"the key {name!r} is given twice (first on line "
                        f"{first[name].start_mark.line + 1}); YAML would keep only this one: "
                        "remove one of them"), file=file, line=key.start_mark.line + 1))
                else:
                    first[name] = key
                todo.append((value, here))
        elif isinstance(current, yaml.SequenceNode):
            todo.extend((item, f"{path}[{i}]") for i, item in enumerate(current.value))
    return sorted(issues, key=lambda i: i.line or 0)


def load_text(text: str, file: str | None = None,
              namespace: str = DEFAULT_NAMESPACE) -> LoadResult:
    """The manifests of one file's text, its errors, and what in it is not a manifest.
    ``namespace`` is the namespace of a ToolManifest resource that names none."""
    result = LoadResult(files=1)
    if not text.strip():
        result.skipped.append(Skip(file, None, "empty", "empty: no document"))
        return result
    parts = list(documents(text, file))
    broken = [p for p in parts if isinstance(p, Issue)]
    if broken and len(broken) == len(parts) and is_helm_template(text):
        result.skipped.append(Skip(file, None, "helm", "a Helm template ({{ ... }}), not YAML: "
                                   "check what it renders to with `helm template ... | "
                                   "unwind validate -`"))
        return result
    lines: list[str] | None = None
    for part in parts:
        if isinstance(part, Issue):
            result.errors.append(part)
            continue
        node, value = part
        result.errors.extend(duplicate_keys(node, file))
        first = len(result.items)
        _collect(value, node, None, file, result, namespace)
        for item in result.items[first:]:
            if item.namespace is None and item.node is not None and "# ignore-check." in text:
                lines = lines if lines is not None else text.splitlines()
                _comment_annotations(item, lines)
            if item.node is not None and "TODO" in text:
                lines = lines if lines is not None else text.splitlines()
                _todo_comments(item, lines)
    return result


_TODO_COMMENT = re.compile(r"#\s*TODO\b[:\s]*(.*?)\s*$")


def _todo_comments(item: Sourced, lines: list[str]) -> None:
    """The ``# TODO`` comments inside a manifest (``unwind manifests scaffold`` writes them
    where a person must decide), each with the field it is about: the key on its line, else
    the next key below it. Lint lists them (L038)."""
    assert item.node is not None
    keys = sorted(_key_lines(item.node, ""))
    start, end = item.node.start_mark.line, min(item.node.end_mark.line + 1, len(lines))
    for number in range(start, end):
        match = _TODO_COMMENT.search(lines[number])
        if match is None or _in_quotes(lines[number][:match.start()]):
            continue
        after = [path for line, path in keys if line >= number]
        item.todos.append((after[0] if after else "", match.group(1)))


def _in_quotes(before: str) -> bool:
    """Whether a ``#`` after ``before`` stands inside a quoted scalar (a description saying
    "# TODO" is not a comment)."""
    quote = None
    for ch in before:
        if quote is None and ch in "\"'":
            quote = ch
        elif ch == quote:
            quote = None
    return quote is not None


def _key_lines(node: yaml.Node, path: str) -> Iterator[tuple[int, str]]:
    """(0-based line, field path) of every mapping key under ``node``."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                here = f"{path}.{key.value}" if path else str(key.value)
                yield key.start_mark.line, here
                yield from _key_lines(value, here)
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            yield from _key_lines(value, f"{path}[{i}]")


_IGNORE_COMMENT = re.compile(r"#\s*(ignore-check\.unwind\.dev/[^\s:]+)\s*:?\s*(.*?)\s*$")


def _comment_annotations(item: Sourced, lines: list[str]) -> None:
    """A bare manifest has no metadata: a comment inside it, `# ignore-check.unwind.dev/L016:
    reason`, stands for the annotation a resource would carry (lint reads both the same)."""
    assert item.node is not None
    for number in range(item.node.start_mark.line, min(item.node.end_mark.line + 1, len(lines))):
        match = _IGNORE_COMMENT.search(lines[number])
        if match:
            item.annotations[match.group(1)] = match.group(2).strip("\"'")
            item.annotation_lines[match.group(1)] = number + 1


def _collect(value: Any, node: yaml.Node, key: yaml.Node | None, file: str | None,
             out: LoadResult, namespace: str) -> None:
    line = (key or node).start_mark.line + 1
    if value is None:
        return
    if isinstance(value, list):
        nodes = node.value if isinstance(node, yaml.SequenceNode) else [node] * len(value)
        for item, item_node in zip(value, nodes, strict=False):
            _collect(item, item_node, None, file, out, namespace)
        return
    if not isinstance(value, dict):
        out.errors.append(Issue(None, "", "expected a tool manifest (a mapping of fields), "
                                f"found {_what(value)}", file=file, line=line))
        return
    kind, api_version = value.get("kind"), value.get("apiVersion")
    if kind is None or (api_version is None and _meant_as_manifest(value)):
        _plain(value, node, file, out, line)
    elif kind == "List":
        items_key, items_node = _entry(node, "items")
        _collect(value.get("items") or [], items_node or node, items_key, file, out, namespace)
    elif kind == "ToolManifest":
        _resource(value, node, file, out, namespace, line)
    elif isinstance(kind, str) and (_unwind_group(api_version) or _near(kind, UNWIND_KINDS)):
        if kind not in UNWIND_KINDS:
            near = _near(kind, UNWIND_KINDS)
            hint = f" (did you mean {near}?)" if near else ""
            out.errors.append(Issue(None, "kind", (
                f"{kind!r} is not a kind Unwind has{hint}: a tool manifest is "
                f"apiVersion: {RESOURCE_API_VERSION}, kind: ToolManifest"), file=file, line=line))
        else:
            out.skipped.append(Skip(file, line, "kubernetes", f"{_object(value)}: an Unwind "
                                    "object, not a ToolManifest"))
    elif api_version is not None:
        out.skipped.append(Skip(file, line, "kubernetes", f"{_object(value)}: not a ToolManifest"))
    else:
        out.skipped.append(Skip(file, line, "other", f"kind {kind!r} without apiVersion: "
                                "neither a tool manifest nor a Kubernetes object"))


def _plain(value: dict[Any, Any], node: yaml.Node, file: str | None, out: LoadResult,
           line: int) -> None:
    """A mapping with no Kubernetes kind: a bare manifest, test cases, or something else."""
    if "effect" not in value and ("tests" in value or ("name" in value and "tool" in value)):
        out.skipped.append(Skip(file, line, "contract_test", "contract test cases: `unwind test` "
                                "runs them"))
    elif _meant_as_manifest(value):
        out.items.append(Sourced(value, file, node))
    else:
        keys = ", ".join(sorted(str(k) for k in value)[:6]) + (", ..." if len(value) > 6 else "")
        out.skipped.append(Skip(file, line, "other", f"a mapping with {keys}: neither a tool "
                                "manifest (tool, effect, permission...) nor a Kubernetes object"))


def _resource(value: dict[Any, Any], node: yaml.Node, file: str | None, out: LoadResult,
              namespace: str, line: int) -> None:
    api_version = value.get("apiVersion")
    if api_version != RESOURCE_API_VERSION:
        out.errors.append(Issue(None, "apiVersion", f"a ToolManifest needs apiVersion: "
                                f"{RESOURCE_API_VERSION} (got {api_version!r})", file=file, line=line))
        return
    meta: dict[str, Any] = value["metadata"] if isinstance(value.get("metadata"), dict) else {}
    spec = value.get("spec")
    spec_key, spec_node = _entry(node, "spec")
    if not isinstance(spec, dict) or spec_node is None:
        out.errors.append(Issue(None, "spec", "a ToolManifest needs spec: the tool manifest",
                                file=file, line=line))
        return
    ns = meta.get("namespace")
    annotations = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    notes_node = _entry(_entry(node, "metadata")[1] or node, "annotations")[1]
    note_lines = {str(k.value): k.start_mark.line + 1 for k, _ in getattr(notes_node, "value", [])
                  if isinstance(k, yaml.ScalarNode)} if isinstance(notes_node, yaml.MappingNode) else {}
    out.items.append(Sourced(
        spec, file, spec_node, resource_name=meta.get("name"),
        namespace=ns if isinstance(ns, str) and ns else namespace,
        annotations={str(k): "" if v is None else str(v) for k, v in (annotations or {}).items()},
        annotation_lines=note_lines,
        key_line=spec_key.start_mark.line + 1 if spec_key is not None else None))


def _meant_as_manifest(value: dict[Any, Any]) -> bool:
    return any(isinstance(k, str) and (k in _MANIFEST_KEYS or _near(k, _MANIFEST_KEYS))
               for k in value)


def _near(word: str, choices: Sequence[str]) -> str | None:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.8)
    if close:
        return close[0]
    return next((c for c in choices if c.lower() == word.lower()), None)


def _unwind_group(api_version: Any) -> bool:
    return isinstance(api_version, str) and api_version.split("/")[0] == API_GROUP


def _object(value: dict[Any, Any]) -> str:
    meta = value.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"Kubernetes {value.get('kind')}" + (f" {name!r}" if name else "")


def _what(value: Any) -> str:
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the text {shown!r}"
    return f"a {type(value).__name__}" if not isinstance(value, int) else f"the number {value}"


def _entry(node: yaml.Node, key: str) -> tuple[yaml.Node | None, yaml.Node | None]:
    """(key node, value node) of ``key`` in a mapping node (the last one, as YAML reads it)."""
    found: tuple[yaml.Node | None, yaml.Node | None] = (None, None)
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                found = (k, v)
    return found


def check(loaded: LoadResult, one_set: bool = False) -> CheckResult:
    """Validate every manifest read, then each set (the bare manifests; the resources of
    each namespace); each issue gets its file and line, and the issues are sorted by file
    and line. ``one_set``: everything read is one set whatever its namespace (a local
    gateway serves what it is given as one catalogue, as a pod's gateway serves one
    namespace's bundle)."""
    issues = list(loaded.errors)
    groups: dict[str | None, list[tuple[ToolManifest, Sourced]]] = {}
    invalid: dict[str | None, set[str]] = {}
    for item in loaded.items:
        manifest, found = validate_manifest(item.data)
        issues.extend(i.located(item.file, item.line_of(i.path)) for i in found)
        group = None if one_set else item.namespace
        if manifest is not None:
            groups.setdefault(group, []).append((manifest, item))
        elif isinstance(item.data.get("tool"), str):
            invalid.setdefault(group, set()).add(item.data["tool"])
    manifests: list[ToolManifest] = []
    sources: list[Sourced] = []
    for namespace, members in groups.items():
        models = [m for m, _ in members]
        for issue in validate_namespace(models):
            index = issue.index if issue.index is not None else next(
                (n for n, m in enumerate(models) if m.tool == issue.tool), None)
            issue = _invalid_reference(issue, invalid.get(namespace, set()))
            src = members[index][1] if index is not None else None
            issues.append(issue.located(src.file, src.line_of(issue.path)) if src else issue)
        manifests += models
        sources += [s for _, s in members]
    issues.sort(key=lambda i: (i.file is None, i.file or "", i.line or 0))
    return CheckResult(manifests, sources, issues, list(loaded.skipped), loaded.files,
                       len(loaded.items))


def _invalid_reference(issue: Issue, invalid: set[str]) -> Issue:
    """A reference to a tool whose own manifest has errors is not 'missing'."""
    if issue.ref is not None and issue.ref in invalid:
        return replace(issue, message=f"names {issue.ref!r}, whose manifest has errors: fix "
                       "them first")
    return issue


def check_paths(paths: Sequence[str | os.PathLike[str]],
                namespace: str = DEFAULT_NAMESPACE, one_set: bool = False) -> CheckResult:
    return check(load_paths(paths, namespace), one_set)


def check_texts(files: Mapping[str, str]) -> list[Issue]:
    """Validate the manifests held in in-memory files (used by the editor before writing)."""
    loaded = LoadResult()
    for name, text in files.items():
        loaded.extend(load_text(text, name))
    return check(loaded).issues
