"""Read manifest and contract test files into units that own reference places.

A *unit* is something that names tools and can be removed as a whole: a
manifest (bare, in a list, or the `spec` of a ToolManifest resource) or a
contract test case (in a list, or in the list under a file's `tests:`). Each unit remembers its *slot*, the document or list item
that holds it, so removal can cut exactly that text.

The node tree comes from ruamel.yaml's composer, whose marks give each node's
character offsets in the source; parse events add what nodes lack: where each
document's `---` is, and where aliases and flow brackets end, so the end of a
list item's text is known even when its last value is an alias.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import Any, Literal

from ruamel.yaml import YAML
from ruamel.yaml.events import (
    CollectionEndEvent,
    DocumentEndEvent,
    DocumentStartEvent,
    Event,
    NodeEvent,
)
from ruamel.yaml.nodes import MappingNode, SequenceNode

from unwind.edit import text as t
from unwind.edit.references import get, text_of

UnitKind = Literal["manifest", "test_case"]


@dataclass(eq=False)
class Document:
    """One `---` document: its root node and where its text begins and ends."""

    index: int
    root: Any
    explicit_start: int | None
    content_start: int
    end_marker_end: int | None


@dataclass(eq=False)
class Unit:
    """A manifest or a test case, with the slot its text occupies."""

    kind: UnitKind
    file: str
    node: MappingNode
    document: Document
    seq: SequenceNode | None
    item: int
    resource: MappingNode | None = None

    @property
    def tool(self) -> str | None:
        """The manifest's own name, or the tool a test case calls."""
        return text_of(get(self.node, "tool"))

    @property
    def case_name(self) -> str:
        """A test case's `name` (empty when missing)."""
        return text_of(get(self.node, "name")) or ""


@dataclass(eq=False)
class ParsedFile:
    """A file's text, documents, units and token spans."""

    path: str
    text: str
    documents: list[Document] = field(default_factory=list)
    units: list[Unit] = field(default_factory=list)
    tokens: list[tuple[int, int]] = field(default_factory=list)

    def content_end(self, lo: int, hi: int) -> int:
        """Where the last token starting in [lo, hi) ends: the real end of a node's text."""
        return max((e for s, e in self.tokens if lo <= s < hi), default=lo)


class ParseError(Exception):
    """A file is not YAML; editing it by name would mean guessing."""


def _is_resource(node: Any) -> bool:
    return text_of(get(node, "kind")) == "ToolManifest" and isinstance(
        get(node, "spec"), MappingNode
    )


def _is_manifest(node: Any) -> bool:
    return isinstance(node, MappingNode) and get(node, "effect") is not None


def _is_test_case(node: Any) -> bool:
    return (
        isinstance(node, MappingNode)
        and get(node, "effect") is None
        and get(node, "name") is not None
        and get(node, "tool") is not None
    )


def _classify(pf: ParsedFile, doc: Document) -> None:
    root = doc.root

    def add(node: Any, seq: SequenceNode | None, item: int, tests: bool) -> None:
        if _is_resource(node):
            pf.units.append(Unit("manifest", pf.path, get(node, "spec"), doc, seq, item, node))
        elif _is_manifest(node):
            pf.units.append(Unit("manifest", pf.path, node, doc, seq, item))
        elif tests and _is_test_case(node):
            pf.units.append(Unit("test_case", pf.path, node, doc, seq, item))

    if isinstance(root, SequenceNode):
        for i, item in enumerate(root.value):
            add(item, root, i, True)
    elif isinstance(root, MappingNode):
        items = get(root, "items")
        cases = get(root, "tests")
        if text_of(get(root, "kind")) == "List" and isinstance(items, SequenceNode):
            for i, item in enumerate(items.value):
                add(item, items, i, False)
        elif isinstance(cases, SequenceNode) and not _is_manifest(root):
            # a contract test file's other form, `tests: [...]` (manifest/contract.py)
            for i, item in enumerate(cases.value):
                add(item, cases, i, True)
        else:
            add(root, None, 0, False)


def parse(path: str, source: str) -> ParsedFile:
    """Compose every document of one file and find its units."""
    pf = ParsedFile(path, source)
    yaml = YAML(typ="rt")
    try:
        events: list[Event] = list(yaml.parse(io.StringIO(source)))
        roots = list(yaml.compose_all(io.StringIO(source)))
    except Exception as exc:
        raise ParseError(f"{path}: not valid YAML: {exc}") from exc
    starts = [e for e in events if isinstance(e, DocumentStartEvent)]
    ends = [e for e in events if isinstance(e, DocumentEndEvent)]
    for ev in events:
        # Block collection marks are zero-width; scalars, aliases and flow brackets are not.
        if (
            isinstance(ev, NodeEvent | CollectionEndEvent)
            and ev.end_mark.index > ev.start_mark.index
        ):
            pf.tokens.append((ev.start_mark.index, ev.end_mark.index))
    for index, (root, start, end) in enumerate(zip(roots, starts, ends, strict=True)):
        doc = Document(
            index=index,
            root=root,
            explicit_start=start.start_mark.index if start.explicit else None,
            content_start=start.end_mark.index if start.explicit else start.start_mark.index,
            end_marker_end=end.end_mark.index if end.explicit else None,
        )
        pf.documents.append(doc)
        _classify(pf, doc)
    return pf


def _document_start(pf: ParsedFile, doc: Document) -> int:
    if doc.explicit_start is not None:
        return t.line_start(pf.text, doc.explicit_start)
    return t.attached_start(pf.text, t.line_start(pf.text, doc.content_start), 0)


def document_range(pf: ParsedFile, doc: Document) -> tuple[int, int]:
    """The text of a whole document: from its `---` (or its attached comments) to the next one."""
    start = _document_start(pf, doc)
    nxt = doc.index + 1
    if nxt < len(pf.documents):
        following = pf.documents[nxt]
        if following.explicit_start is None and doc.end_marker_end is not None:
            end = t.line_after(pf.text, doc.end_marker_end)
        else:
            end = _document_start(pf, following)
    else:
        end = len(pf.text)
        if doc.index > 0:
            start = t.eat_blank_lines_above(pf.text, start)
    return start, end


def _block_item_start(pf: ParsedFile, seq: SequenceNode, i: int) -> int:
    node = seq.value[i]
    dash = t.find_dash(pf.text, node.start_mark.index)
    column = dash - t.line_start(pf.text, dash)
    return t.attached_start(pf.text, t.line_start(pf.text, dash), column)


def item_ranges(pf: ParsedFile, seq: SequenceNode, removed: set[int]) -> list[tuple[int, int]]:
    """Cut ranges for the removed items of one sequence (not all of them).

    Block style: an item runs from its attached comments to the next item's
    attached comments; the last item ends with its own last line and also takes
    the blank lines above it. Flow style: an item takes the comma after it, or
    the comma before it when it ends the list.
    """
    items = seq.value
    last = len(items) - 1
    seq_end = seq.end_mark.index
    ranges: list[tuple[int, int]] = []
    for first, final in _runs(sorted(removed)):
        if seq.flow_style:
            if final < last:
                ranges.append((items[first].start_mark.index, items[final + 1].start_mark.index))
            else:
                prev = items[first - 1].start_mark.index
                own = items[final].start_mark.index
                ranges.append(
                    (
                        pf.content_end(prev, items[first].start_mark.index),
                        pf.content_end(own, seq_end - 1),
                    )
                )
            continue
        start = _block_item_start(pf, seq, first)
        if final < last:
            end = _block_item_start(pf, seq, final + 1)
        else:
            end = t.line_after(pf.text, pf.content_end(items[final].start_mark.index, seq_end))
            start = t.eat_blank_lines_above(pf.text, start)
        ranges.append((start, end))
    return ranges


def _runs(indices: list[int]) -> list[tuple[int, int]]:
    """Group sorted indices into maximal runs of neighbours: [1, 2, 4] -> [(1, 2), (4, 4)]."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    return runs


def removal_ranges(pf: ParsedFile, units: list[Unit]) -> list[tuple[int, int]]:
    """Cut ranges that remove these units of one file.

    A sequence that would be left empty is removed with its whole document
    (a manifest list or a `kind: List` with nothing in it says nothing).
    """
    whole: set[int] = set()
    per_seq: dict[int, tuple[SequenceNode, Document, set[int]]] = {}
    for unit in units:
        if unit.seq is None:
            whole.add(unit.document.index)
        else:
            entry = per_seq.setdefault(id(unit.seq), (unit.seq, unit.document, set()))
            entry[2].add(unit.item)
    ranges: list[tuple[int, int]] = []
    for seq, doc, removed in per_seq.values():
        if len(removed) == len(seq.value):
            whole.add(doc.index)
        elif doc.index not in whole:
            ranges.extend(item_ranges(pf, seq, removed))
    for index in whole:
        ranges.append(document_range(pf, pf.documents[index]))
    return ranges
