"""Which files an edit works on, and why it leaves the others alone.

Run from a repository root, an edit reads every YAML file there: Helm templates, CRDs,
other Kubernetes objects, configuration. They hold no manifest and no contract test.
Refusing the whole edit because a template is not YAML would make the command useless
from a root, and handing a `Chart.yaml` to the validator would judge it as a manifest;
so each file is sorted, by its content alone, into one of:

- *edited*: it parses and holds a manifest or a test case, or a mapping with `tool:`
  (a manifest the validator must see and reject, as before);
- *broken*: not YAML, and it mentions `tool:` or `kind: ToolManifest`, so it looks like
  a manifest or a contract test: the edit is refused with `parse_error`, because
  editing around it would be a guess (a name it holds would be left behind);
- *skipped*, with the reason: a Helm template (Go template actions such as
  `{{ .Values.x }}` or `{{- include ... }}`; the `{{args.x}}` of an idempotency key is
  not one), not YAML and naming no tool, or YAML that holds no manifest and no test.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml.nodes import MappingNode, SequenceNode

from unwind.edit.references import get, text_of
from unwind.edit.result import Skipped
from unwind.edit.source import ParsedFile, ParseError, parse
from unwind.workspace.classify import LOOKS_LIKE_MANIFEST, is_helm_template

NAME_CHAR = r"[A-Za-z0-9_.:/-]"


@dataclass
class Selection:
    """The files an edit works on (`files`, `parsed`, `broken`) and the ones it skips."""

    files: dict[str, str] = field(default_factory=dict)
    parsed: list[ParsedFile] = field(default_factory=list)
    broken: list[ParseError] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def _names_a_tool(node: Any) -> bool:
    """A mapping with `tool:` or a ToolManifest, alone, in a list or under `items`/`tests`."""
    if isinstance(node, SequenceNode):
        return any(_names_a_tool(item) for item in node.value)
    if not isinstance(node, MappingNode):
        return False
    if get(node, "tool") is not None or text_of(get(node, "kind")) == "ToolManifest":
        return True
    return any(isinstance(get(node, key), SequenceNode) and _names_a_tool(get(node, key))
               for key in ("items", "tests"))


def _no_unit_reason(pf: ParsedFile) -> str:
    roots = [d.root for d in pf.documents if d.root is not None]
    if not roots:
        return "empty"
    kinds = [text_of(get(r, "kind")) for r in roots]
    if all(kinds):
        return f"holds Kubernetes {', '.join(sorted({k for k in kinds if k}))}, no ToolManifest"
    return "holds no tool manifest and no contract test"


def mentions(text: str, names: Sequence[str]) -> tuple[str, ...]:
    """The names that appear in `text` as whole names (not inside a longer one)."""
    return tuple(n for n in dict.fromkeys(names)
                 if re.search(rf"(?<!{NAME_CHAR}){re.escape(n)}(?!{NAME_CHAR})", text))


def select(files: Mapping[str, str], names: Sequence[str] = ()) -> Selection:
    """Sort `files` (path order) into edited, broken and skipped; `names` are the tools the
    edit is about, reported when a skipped file still mentions them."""
    out = Selection()
    for path in sorted(files):
        text = files[path]

        def skip(reason: str, path: str = path, text: str = text) -> None:
            out.skipped.append(Skipped(path, reason, mentions(text, names)))

        try:
            pf = parse(path, text)
        except ParseError as exc:
            if is_helm_template(text):
                skip("a Helm template ({{ ... }}): not plain YAML, not edited")
            elif LOOKS_LIKE_MANIFEST.search(text):
                out.files[path] = text
                out.broken.append(exc)
            else:
                problem = str(exc.__cause__ or exc).splitlines()[0]
                skip(f"not valid YAML ({problem}) and names no tool")
            continue
        if pf.units or any(_names_a_tool(d.root) for d in pf.documents):
            out.files[path] = text
            out.parsed.append(pf)
        else:
            skip(_no_unit_reason(pf))
    return out
