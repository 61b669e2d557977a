"""The modules of unwind.cli import each other one way only: no cycle, counting the imports
inside functions (the lazy ones that keep `unwind operator` light) and the command modules
main.py imports by name (_MODULE_COMMANDS).

A cycle makes a module's meaning depend on import order and hides which one is the
entry point; the test names the cycle when there is one."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import unwind.cli

CLI = Path(unwind.cli.__file__).parent
PACKAGE = "unwind.cli"


def _module_names() -> set[str]:
    return {p.stem for p in CLI.glob("*.py") if p.stem != "__init__"}


def _sibling(dotted: str, names: set[str]) -> str | None:
    """The cli module a dotted name inside unwind.cli (``plans`` or ``plans.x``) is in."""
    first = dotted.split(".", 1)[0]
    return first if first in names else None


def imports_of(source: str, names: set[str]) -> set[str]:
    """The sibling cli modules a module's source imports, at any depth of the code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(f"{PACKAGE}."):
                    found.add(_sibling(alias.name[len(PACKAGE) + 1:], names) or "")
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1 and node.module:  # from .x import y
                found.add(_sibling(node.module, names) or "")
            elif node.level == 1 or (node.level == 0 and node.module == PACKAGE) \
                    or (node.level == 2 and node.module == "cli"):  # from . import x, y
                found.update(a.name for a in node.names if a.name in names)
            elif node.level == 0 and node.module and node.module.startswith(f"{PACKAGE}."):
                found.add(_sibling(node.module[len(PACKAGE) + 1:], names) or "")
            elif node.level == 2 and node.module and node.module.startswith("cli."):
                found.add(_sibling(node.module[len("cli."):], names) or "")
    found.discard("")
    return found


def cli_graph() -> dict[str, set[str]]:
    from unwind.cli.main import _MODULE_COMMANDS

    names = _module_names()
    graph = {n: imports_of((CLI / f"{n}.py").read_text(encoding="utf-8"), names) for n in names}
    graph["main"].update(m for ms in _MODULE_COMMANDS.values() for m in ms)  # importlib, by name
    return graph


def find_cycle(graph: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle as the path that closes it (["a", "b", "a"]), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return [*path[path.index(nxt):], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_cli_modules_import_each_other_without_a_cycle() -> None:
    graph = cli_graph()
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle among unwind.cli modules: {' -> '.join(cycle)}"


def test_the_graph_sees_top_level_function_level_and_by_name_imports() -> None:
    graph = cli_graph()
    assert "plugin_view" in graph["plugin_cmds"]  # from . import plugin_view as view
    assert "plans" in graph["rollback_cmds"]  # from .plans import ... (module level)
    assert "plugin_cmds" in graph["rollback_cmds"]  # from . import plugin_cmds (in a function)
    assert "completion" in graph["main"]  # from .completion import ... (in a function)
    assert {"rollback_cmds", "plugin_cmds", "gateway_cmds"} <= graph["main"]  # importlib


def test_the_helpers_import_no_command_module() -> None:
    """output, usage, kubectl, plans, plugin_view...: below every *_cmds module and main."""
    def command(m: str) -> bool:
        return m.endswith("_cmds") or m == "main"

    graph = cli_graph()
    upward = {m: sorted(filter(command, deps)) for m, deps in graph.items() if not command(m)}
    assert not any(upward.values()), {m: deps for m, deps in upward.items() if deps}
    assert "plans" in graph and graph["plans"] <= {"output"}, graph.get("plans")


def test_imports_are_read_in_every_spelling() -> None:
    names = {"a", "b", "c", "d", "e", "f"}
    source = ("from . import a\nfrom .b import x\nimport unwind.cli.c\n"
              "def f():\n    from unwind.cli.d import y\n    from ..cli import e\n"
              "    from ..cli.f import z\n    from .. import cli\n    from ..ledger import a\n")
    assert imports_of(source, names) == {"a", "b", "c", "d", "e", "f"}


def test_find_cycle_names_the_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"main": {"completion"}, "completion": {"main"}}) == ["completion", "main", "completion"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
