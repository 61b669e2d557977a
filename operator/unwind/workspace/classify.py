"""What a file in a project folder is, from its path alone, before anything parses it.

`unwind validate .` from a repository root meets much more than manifests. Most files are
told apart by their content (the loader sorts each YAML document into a manifest, a
contract test, another Kubernetes object...), but a few are only recognisable by where
they sit, and reading them as manifests would report nonsense:

- `unwind.yaml`: the CLI's configuration (registry, trusted keys);
- a folder registry: `index.json` beside a `tools/` folder, and `tools/<tool>/v<N>.json`
  under it, checked as a registry (checksums, signatures), never as manifests;
- a Helm chart: `Chart.yaml`, `Chart.lock`, `values*.yaml` beside them, and everything
  under the chart's `templates/` (Go templates, not YAML until rendered: `helm template
  ... | unwind validate -` checks what they render to).

Every other file is `content`: the loader decides. Helm template syntax is also
recognised in text (`is_helm_template`), for a template found outside a chart folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Kind = Literal["content", "config", "registry", "helm"]

CONFIG_FILE = "unwind.yaml"
_VERSION_FILE = re.compile(r"v[1-9][0-9]*\.json")
HELM_ACTION = re.compile(
    r"\{\{-|\{\{\s*(?:[.$]|/\*|(?:if|else|end|range|with|define|block|template|include|"
    r"toYaml|toJson|tpl|required|default|quote|printf|lookup)\b)"
)
# Mentions of `tool:` or `kind: ToolManifest`: a file that says this and does not parse is
# a broken manifest or contract test, never something to skip.
LOOKS_LIKE_MANIFEST = re.compile(
    r"""(?<![\w.-])["']?tool["']?\s*:|kind\s*:\s*["']?ToolManifest\b"""
)


@dataclass(frozen=True)
class FileKind:
    """What a file is; `root` is the registry or chart folder it belongs to, `reason` a
    sentence for the list of files that were not read as manifests."""

    kind: Kind
    reason: str = ""
    root: Path | None = None


def is_helm_template(text: str) -> bool:
    """Go template actions such as `{{ .Values.x }}` or `{{- include ... }}` (the
    `{{args.x}}` of an idempotency key is not one)."""
    return HELM_ACTION.search(text) is not None


def registry_root(path: Path) -> Path | None:
    """The folder registry `path` belongs to, if it is its index or one of its versions."""
    if path.name == "index.json" and (path.parent / "tools").is_dir():
        return path.parent
    tools = path.parent.parent
    if _VERSION_FILE.fullmatch(path.name) and tools.name == "tools" \
            and (tools.parent / "index.json").is_file():
        return tools.parent
    return None


def chart_root(path: Path) -> Path | None:
    """The Helm chart folder `path` is part of: a `Chart.yaml` beside it, or above the
    `templates/` folder it is in."""
    if (path.parent / "Chart.yaml").is_file():
        return path.parent
    for folder in path.parents:
        if folder.name == "templates" and (folder.parent / "Chart.yaml").is_file():
            return folder.parent
    return None


def classify_path(path: Path) -> FileKind:
    if path.name == CONFIG_FILE:
        return FileKind("config", "the CLI's configuration (unwind.yaml)")
    root = registry_root(path)
    if root is not None:
        return FileKind("registry", f"part of the folder registry {root}", root)
    chart = chart_root(path)
    if chart is not None:
        rel = path.relative_to(chart)
        if rel.parts[0] == "templates":
            return FileKind("helm", f"a template of the Helm chart {chart}: check what it "
                            "renders to with `helm template ... | unwind validate -`", chart)
        if path.name in ("Chart.yaml", "Chart.lock") or re.fullmatch(r"values.*\.ya?ml", path.name):
            return FileKind("helm", f"the Helm chart {chart}'s {path.name}", chart)
    return FileKind("content")
