"""Check a project folder: each file as what it is.

`unwind validate .` from a repository root reads manifests, contract tests, a folder
registry, `unwind.yaml`, Helm charts and other Kubernetes YAML. The loader sorts the
documents (`manifest.loader`), `classify` the files known by their place; here each kind
that has a check of its own gets it:

- manifests: every rule, then each namespace's set (`validate_namespace`);
- contract test files: their cases parse and have the fields a case has (running them
  is `unwind test`'s job, which also needs to know which manifests they test);
- a folder registry: `verify` (the index, every version's file and checksum, and the
  signatures when a trusted key is configured);
- `unwind.yaml`: it reads as the CLI's configuration.

Helm charts and other Kubernetes objects are listed as not checked, with why.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..manifest.contract import load_cases_text
from ..manifest.issues import Issue
from ..manifest.loader import DEFAULT_NAMESPACE, CheckResult, Skip, check, load_paths

# What `checked` counts, as (one, many) for people.
CHECKED = {"tool_manifests": ("tool manifest", "tool manifests"),
           "contract_test_files": ("contract test file", "contract test files"),
           "folder_registries": ("folder registry", "folder registries"),
           "configuration_files": ("configuration file", "configuration files")}


@dataclass
class ProjectCheck:
    """What was found and checked, every problem, and what was left unchecked."""

    result: CheckResult
    issues: list[Issue] = field(default_factory=list)
    checked: Counter[str] = field(default_factory=Counter)  # what (see CHECKED) -> how many
    skipped: list[Skip] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.issues


def check_project(paths: Sequence[str | os.PathLike[str]],
                  namespace: str = DEFAULT_NAMESPACE) -> ProjectCheck:
    result = check(load_paths(paths, namespace))
    out = ProjectCheck(result, list(result.issues))
    out.checked["tool_manifests"] = result.read
    tests: dict[str, None] = {}
    registries: dict[Path, None] = {}
    for skip in result.skipped:
        if skip.kind == "contract_test" and skip.file:
            tests[skip.file] = None
        elif skip.kind == "registry" and skip.file:
            registries[_registry_root(Path(skip.file))] = None
        elif skip.kind == "config" and skip.file:
            out.issues += _check_config(Path(skip.file))
            out.checked["configuration_files"] += 1
        else:
            out.skipped.append(skip)
    for file in tests:
        out.issues += _check_tests(file)
        out.checked["contract_test_files"] += 1
    for root in registries:
        out.issues += _check_registry(root)
        out.checked["folder_registries"] += 1
    return out


def _check_tests(file: str) -> list[Issue]:
    if file == "<stdin>":
        return []  # already consumed; `unwind test` reads test files
    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [Issue(None, "", f"cannot read the file: {exc}", file=file)]
    return load_cases_text(text, file)[1]


def _registry_root(path: Path) -> Path:
    return path.parent if path.name == "index.json" else path.parent.parent.parent


def _check_registry(root: Path) -> list[Issue]:
    from ..registry import FolderStorage, Registry, RegistryError, load_config, resolve_trust

    index = str(root / "index.json")
    try:
        trust = resolve_trust(None, load_config())
        problems = Registry(FolderStorage(str(root))).verify(trust)
    except RegistryError as exc:
        return [Issue(None, "", f"folder registry: {exc.message}", file=index)]
    return [Issue(p.tool, "", f"folder registry: {p.message}" if p.tool is None else
                  f"folder registry, version {p.version}: {p.message}", file=p.file)
            for p in problems]


def _check_config(path: Path) -> list[Issue]:
    import difflib

    import yaml

    from ..registry import RegistryError, load_config
    from ..registry.config import KNOWN_KEYS

    try:
        load_config(path.parent)
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except RegistryError as exc:
        return [Issue(None, "", exc.message, file=str(path))]
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:  # pragma: no cover - load_config read it
        return [Issue(None, "", f"cannot read the file: {exc}", file=str(path))]
    issues = []
    for key in sorted(set(map(str, data)) - set(KNOWN_KEYS)):
        close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        issues.append(Issue(None, key, f"unknown key {key!r}{hint}: unwind.yaml holds "
                            f"{', '.join(KNOWN_KEYS)}", file=str(path)))
    return issues
