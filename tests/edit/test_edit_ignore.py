"""The .gitignore matcher behind the folder walk: the patterns people write, as git reads them."""

from __future__ import annotations

import pytest

from unwind.workspace.ignore import ignored, parse_gitignore

CASES = [
    # (pattern lines, path, is_dir, ignored?)
    ("build/", "build", True, True),
    ("build/", "src/build", True, True),
    ("build/", "build", False, False),  # a trailing slash matches folders only
    ("/dist", "dist", True, True),
    ("/dist", "src/dist", True, False),  # a leading slash anchors to the .gitignore's folder
    ("*.log", "a/b/c.log", False, True),
    ("*.log", "a/b/c.yaml", False, False),
    ("docs/*.yaml", "docs/a.yaml", False, True),
    ("docs/*.yaml", "docs/x/a.yaml", False, False),  # * does not cross a slash
    ("docs/*.yaml", "src/docs/a.yaml", False, False),  # an inner slash anchors too
    ("**/gen", "a/b/gen", True, True),
    ("**/gen", "gen", True, True),
    ("a/**/b", "a/x/y/b", True, True),
    ("a/**/b", "a/b", True, True),
    ("out/**", "out/x.yaml", False, True),
    ("v?.yaml", "v1.yaml", False, True),
    ("v?.yaml", "v10.yaml", False, False),
    ("v[0-9].yaml", "v7.yaml", False, True),
    ("v[!0-9].yaml", "v7.yaml", False, False),
    ("*.yaml\n!keep.yaml", "keep.yaml", False, False),  # a later negation wins
    ("!keep.yaml\n*.yaml", "keep.yaml", False, True),  # ... and an earlier one loses
    ("# a comment\n\n", "# a comment", False, False),
    ("\\#hash.yaml", "#hash.yaml", False, True),
    ("\\!bang.yaml", "!bang.yaml", False, True),
    ("name.yaml   ", "name.yaml", False, True),  # trailing spaces are dropped
    ("a+b(c).yaml", "a+b(c).yaml", False, True),  # regex characters are literal
]


@pytest.mark.parametrize(("patterns", "path", "is_dir", "expected"), CASES)
def test_a_pattern_ignores_what_git_would_ignore(
        patterns: str, path: str, is_dir: bool, expected: bool) -> None:
    assert ignored(parse_gitignore(patterns), path, is_dir) is expected


def test_a_deeper_gitignore_applies_below_its_own_folder_and_wins() -> None:
    rules = parse_gitignore("*.yaml\n") + parse_gitignore("!/keep.yaml\n/local.yaml\n", "sub")
    assert ignored(rules, "top.yaml", False)
    assert not ignored(rules, "sub/keep.yaml", False)
    assert ignored(rules, "sub/other.yaml", False)
    assert ignored(rules, "sub/local.yaml", False)
    assert ignored(rules, "keep.yaml", False)  # the negation is anchored to sub/
