"""Reading manifests from files and folders.

A YAML or JSON file holds one or more documents; each document is a bare manifest, a list
of them, or a Kubernetes resource (``kind: ToolManifest`` with the manifest in ``spec``, or
a ``kind: List``). Parsing keeps each document's node tree so that an error can name the
line of the exact field it is about; the tree is only walked when there is an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import API_GROUP, API_VERSION
from .issues import Issue
from .model import ToolManifest
from .validate import validate_manifest, validate_set

_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
RESOURCE_API_VERSION = f"{API_GROUP}/{API_VERSION}"
SUFFIXES = (".yaml", ".yml", ".json")


@dataclass
class Sourced:
    """One manifest as read: its raw mapping and where it came from."""

    data: Any
    file: str | None = None
    node: yaml.Node | None = None
    resource_name: str | None = None  # metadata.name for a ToolManifest resource

    @property
    def line(self) -> int | None:
        return self.node.start_mark.line + 1 if self.node is not None else None

    def line_of(self, path: str) -> int | None:
        """The line of the field at ``path`` (or of its closest existing parent)."""
        node = self.node
        if node is None:
            return None
        line = node.start_mark.line + 1
        for seg in _split_path(path):
            if isinstance(node, yaml.SequenceNode) and isinstance(seg, int) and seg < len(node.value):
                child: yaml.Node | None = node.value[seg]
            else:
                child = _child(node, str(seg))
            if child is None:
                break
            node = child
            line = node.start_mark.line + 1
        return line


@dataclass
class LoadResult:
    items: list[Sourced] = field(default_factory=list)
    errors: list[Issue] = field(default_factory=list)

    def extend(self, other: LoadResult) -> None:
        self.items.extend(other.items)
        self.errors.extend(other.errors)


@dataclass
class CheckResult:
    manifests: list[ToolManifest]
    sources: list[Sourced]
    issues: list[Issue]

    @property
    def ok(self) -> bool:
        return not self.issues


_SEGMENT = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _split_path(path: str) -> list[str | int]:
    return [name if name else int(index) for name, index in _SEGMENT.findall(path)]


def expand_paths(paths: Iterable[str | os.PathLike[str]],
                 suffixes: tuple[str, ...] = SUFFIXES) -> tuple[list[Path], list[Issue]]:
    """Files as given, and every file with one of ``suffixes`` under each folder (recursive,
    sorted, hidden names skipped); a path that does not exist is an error."""
    files: list[Path] = []
    errors: list[Issue] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*") if p.suffix in suffixes and p.is_file()
                                and not any(part.startswith(".") for part in p.relative_to(path).parts)))
        elif path.is_file():
            files.append(path)
        else:
            errors.append(Issue(None, "", "no such file or folder", file=str(path)))
    return files, errors


def load_paths(paths: Sequence[str | os.PathLike[str]]) -> LoadResult:
    files, errors = expand_paths(paths)
    result = LoadResult(errors=errors)
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            result.errors.append(Issue(None, "", f"cannot read the file: {exc}", file=str(path)))
            continue
        result.extend(load_text(text, str(path)))
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


def load_text(text: str, file: str | None = None) -> LoadResult:
    result = LoadResult()
    try:
        docs = list(parse_documents(text, file))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        result.errors.append(Issue(None, "", f"YAML syntax error: {problem}", file=file,
                                   line=mark.line + 1 if mark is not None else None))
        return result
    for node, value in docs:
        _collect(value, node, file, result)
    return result


def _collect(value: Any, node: yaml.Node, file: str | None, out: LoadResult) -> None:
    if value is None:
        return
    if isinstance(value, list):
        nodes = node.value if isinstance(node, yaml.SequenceNode) else [node] * len(value)
        for item, item_node in zip(value, nodes, strict=False):
            _collect(item, item_node, file, out)
        return
    if not isinstance(value, dict):
        out.errors.append(Issue(None, "", f"expected a manifest mapping, found {type(value).__name__}",
                                file=file, line=node.start_mark.line + 1))
        return
    if "kind" not in value:
        out.items.append(Sourced(value, file, node))
        return
    kind, api_version = value.get("kind"), value.get("apiVersion")
    if kind == "List":
        _collect(value.get("items") or [], _child(node, "items") or node, file, out)
    elif kind == "ToolManifest":
        if api_version != RESOURCE_API_VERSION:
            out.errors.append(Issue(None, "apiVersion", f"a ToolManifest needs apiVersion: "
                                    f"{RESOURCE_API_VERSION} (got {api_version!r})",
                                    file=file, line=node.start_mark.line + 1))
            return
        meta: dict[str, Any] = value["metadata"] if isinstance(value.get("metadata"), dict) else {}
        spec = value.get("spec")
        spec_node = _child(node, "spec")
        if not isinstance(spec, dict) or spec_node is None:
            out.errors.append(Issue(None, "spec", "a ToolManifest needs spec: the tool manifest",
                                    file=file, line=node.start_mark.line + 1))
            return
        out.items.append(Sourced(spec, file, spec_node, resource_name=meta.get("name")))
    # Other resources (a Namespace, RBAC for agents...) may sit beside manifests in a
    # folder that is also `kubectl apply`-ed; they are not ours to judge.


def _child(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode) and k.value == key:
                child: yaml.Node = v
                return child
    return None


def check(loaded: LoadResult) -> CheckResult:
    """Validate every manifest read, then the set; each issue gets its file and line."""
    issues = list(loaded.errors)
    manifests: list[ToolManifest] = []
    sources: list[Sourced] = []
    for item in loaded.items:
        manifest, found = validate_manifest(item.data)
        issues.extend(i.located(item.file, item.line_of(i.path)) for i in found)
        if manifest is not None:
            manifests.append(manifest)
            sources.append(item)
    for issue in validate_set(manifests):
        if issue.index is None:  # a cycle: reported on its first tool
            index = next((n for n, m in enumerate(manifests) if m.tool == issue.tool), None)
        else:
            index = issue.index
        src = sources[index] if index is not None else None
        issues.append(issue.located(src.file, src.line_of(issue.path)) if src else issue)
    return CheckResult(manifests, sources, issues)


def check_paths(paths: Sequence[str | os.PathLike[str]]) -> CheckResult:
    return check(load_paths(paths))


def check_texts(files: Mapping[str, str]) -> list[Issue]:
    """Validate the manifests held in in-memory files (used by the editor before writing)."""
    loaded = LoadResult()
    for name, text in files.items():
        loaded.extend(load_text(text, name))
    return check(loaded).issues
