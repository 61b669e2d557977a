""".gitignore patterns, for the folders the CLI walks (`unwind validate`, `lint`, `test`,
`unwind manifests rename|remove`).

A repository root holds `.venv/`, build output and other things nobody wants edited or
even read; git already lists them. This is a small matcher for the patterns people
write, not all of git: comments, blank lines, `!` negation, a trailing `/` for folders
only, a leading or inner `/` anchoring the pattern to the .gitignore's folder, `*`, `?`,
`[...]` and `**`. Not supported: `.git/info/exclude`, the global excludes file, and
.gitignore files above the folder being walked. (The `pathspec` package would do all of
it, but it is only installed as a dependency of mypy, and this is runtime code.)
Later patterns win over earlier ones, and a deeper .gitignore over a higher one, as in
git; a file inside an ignored folder stays ignored because the folder is never walked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Rule:
    """One pattern line of the .gitignore in folder `base` (posix, relative to the walk)."""

    base: str
    regex: re.Pattern[str]
    negate: bool
    folders_only: bool
    anchored: bool

    def matches(self, path: str, is_dir: bool) -> bool:
        """Does this rule match `path` (posix, relative to the walk, under `base`)?"""
        if self.folders_only and not is_dir:
            return False
        rel = path[len(self.base) + 1:] if self.base else path
        target = rel if self.anchored else rel.rsplit("/", 1)[-1]
        return self.regex.fullmatch(target) is not None


def _translate(glob: str) -> str:
    """A gitignore glob as a regular expression over a posix path."""
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        elif glob[i] == "[" and (end := glob.find("]", i + 2)) != -1:
            body = glob[i + 1:end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif glob[i] == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return "".join(out)


def parse_gitignore(text: str, base: str = "") -> list[Rule]:
    """The rules of one .gitignore file found in folder `base` ("" for the walk's root)."""
    rules: list[Rule] = []
    for raw in text.splitlines():
        line = raw.rstrip()
        if raw.endswith("\\ "):  # an escaped trailing space is part of the pattern
            line = raw[:-2] + " "
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if negate or line.startswith(("\\!", "\\#")):
            line = line[1:]
        folders_only = line.endswith("/")
        line = line.rstrip("/")
        if not line:
            continue
        anchored = "/" in line
        line = line.lstrip("/")
        try:
            regex = re.compile(_translate(line))
        except re.error:  # a pattern git would not understand either: ignore the line
            continue
        rules.append(Rule(base, regex, negate, folders_only, anchored))
    return rules


def ignored(rules: list[Rule], path: str, is_dir: bool) -> bool:
    """Is `path` ignored by `rules` (ordered from the highest .gitignore down)?"""
    verdict = False
    for rule in rules:
        if rule.matches(path, is_dir):
            verdict = not rule.negate
    return verdict
