"""Shared helpers for the edit tests: fixture folders as `{path: text}` maps."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def load_tree(root: Path) -> dict[str, str]:
    """Every YAML file under `root`, keyed by its posix path relative to `root`, bytes intact."""
    files: dict[str, str] = {}
    for path in sorted(root.rglob("*.y*ml")):
        with open(path, encoding="utf-8", newline="") as handle:
            files[path.relative_to(root).as_posix()] = handle.read()
    return files


def before(case: str) -> dict[str, str]:
    return load_tree(FIXTURES / case / "before")


def after(case: str) -> dict[str, str]:
    return load_tree(FIXTURES / case / "after")
