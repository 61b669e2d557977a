"""What ``publish`` accepts: files and folders (bare manifests or ``kind: ToolManifest``
resources), parsed models, or plain mappings, each checked on its own here; the set is
checked later by the registry, together with what it already holds, because a file may
name a tool published earlier."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from typing import Any

from ..manifest.loader import load_paths
from ..manifest.model import ToolManifest
from ..manifest.validate import validate_manifest
from .errors import RegistryError

Source = str | os.PathLike[str] | ToolManifest | dict[str, Any]


def read_sources(sources: Iterable[Source]) -> list[ToolManifest]:
    """Every manifest, normalized; RegistryError ``invalid`` listing every issue found."""
    paths: list[str | os.PathLike[str]] = []
    manifests: list[ToolManifest] = []
    problems: list[str] = []
    for source in sources:
        if isinstance(source, ToolManifest):
            manifests.append(source)
        elif isinstance(source, dict):
            manifest, issues = validate_manifest(source)
            problems.extend(str(i) for i in issues)
            if manifest is not None:
                manifests.append(manifest)
        else:
            paths.append(source)
    if paths:
        loaded = load_paths(paths)
        problems.extend(str(i) for i in loaded.errors)
        for item in loaded.items:
            manifest, issues = validate_manifest(item.data)
            problems.extend(str(i.located(item.file, item.line_of(i.path))) for i in issues)
            if manifest is not None:
                manifests.append(manifest)
    counts = Counter(m.tool for m in manifests)
    problems.extend(f"{tool}: declared {n} times in what is published: keep one manifest"
                    for tool, n in sorted(counts.items()) if n > 1)
    if problems:
        raise RegistryError("invalid", "; ".join(problems))
    if not manifests:
        raise RegistryError("invalid", "nothing to publish: no manifest found")
    return manifests
