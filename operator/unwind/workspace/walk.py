"""Walking folders the way git sees them.

A repository root holds `.git/`, `.venv/`, build output and other things nobody wants
checked or edited; hidden names are not entered and what a `.gitignore` or an
`.unwindignore` in the walked tree ignores is left out (see `ignore`; `.unwindignore` has
the same syntax, for files git keeps but Unwind should not read, such as test fixtures that
are invalid on purpose). Symbolic links to folders are not followed (a link loop would
never end, and a link out of the tree would check someone else's files); they are
reported, so that a folder that only holds such a link is not a silent "nothing here". A
file or folder named by the person is always read, hidden or ignored.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .ignore import Rule, ignored, parse_gitignore

# Read in each walked folder, in this order (a later file's patterns win): git's, then the
# one for what git keeps but Unwind should not read (fixtures invalid on purpose).
IGNORE_FILES = (".gitignore", ".unwindignore")


@dataclass
class Walked:
    """The files found (sorted), which of them were named on the command line, the
    symbolic links to folders that were not followed, and the paths that do not exist."""

    files: list[Path] = field(default_factory=list)
    given: set[Path] = field(default_factory=set)
    links: list[Path] = field(default_factory=list)
    missing: list[Path] = field(default_factory=list)


def walk(root: Path, suffixes: tuple[str, ...], links: list[Path] | None = None) -> list[Path]:
    """The files ending in one of `suffixes` under `root`, not entering hidden names (`.git`,
    `.venv`, `.dev`...), what a .gitignore or .unwindignore in the walked tree ignores, or
    symbolic links to folders (appended to `links` when given)."""
    found: list[Path] = []
    rules_by_dir: dict[str, list[Rule]] = {}
    for here, dirs, names in os.walk(root):
        rel_dir = Path(here).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        rules = list(rules_by_dir.get(rel_dir, []))
        for ignore_file in IGNORE_FILES:
            if ignore_file in names:
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    text = Path(here, ignore_file).read_text(encoding="utf-8")
                    rules += parse_gitignore(text, rel_dir)

        def keep(name: str, is_dir: bool, rel_dir: str = rel_dir, rules: list[Rule] = rules) -> bool:
            rel = f"{rel_dir}/{name}" if rel_dir else name
            return not name.startswith(".") and not ignored(rules, rel, is_dir)

        kept = sorted(d for d in dirs if keep(d, True))
        dirs[:] = [d for d in kept if not os.path.islink(os.path.join(here, d))]
        if links is not None:
            links += [Path(here, d) for d in kept if d not in dirs]
        for d in dirs:
            rules_by_dir[f"{rel_dir}/{d}" if rel_dir else d] = rules
        found += [Path(here, n) for n in names if n.endswith(suffixes) and keep(n, False)]
    return sorted(found)


def expand(paths: Iterable[str | os.PathLike[str]], suffixes: tuple[str, ...]) -> Walked:
    """Files as given, and the files `walk` finds under each folder, sorted and each once."""
    out = Walked()
    files: dict[Path, None] = {}
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.update(dict.fromkeys(walk(path, suffixes, out.links)))
        elif path.is_file():
            files[path] = None
            out.given.add(path)
        else:
            out.missing.append(path)
    out.files = sorted(files)
    return out
