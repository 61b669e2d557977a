"""The package's layers: what production code may import.

- Nothing under ``operator/unwind`` imports ``benchmarks`` (the benchmarks sit beside the
  package, at the repository root, and may start the local control plane).
- ``unwind.controlplane`` (the local test control plane: etcd, kube-apiserver, a node) is
  imported only by itself and, inside functions, by the CLI's ``dev`` commands
  (``cli/cluster_cmds.py``): an installed gateway or operator never loads it.
- The upstream client (``unwind.upstream``) sits below both the gateway and the undo step:
  the undo step (``unwind.undo``) does not import the gateway package, and
  ``unwind.upstream`` imports neither.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "operator" / "unwind"


def _module(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(absolute module imported, line, at module level) for each import in the file."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    top = {id(node) for node in tree.body}
    found: list[tuple[str, int, bool]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            # `from unwind import controlplane` imports the subpackage too
            found += [(f"{name}.{alias.name}", node.lineno, id(node) in top) for alias in node.names]
    return found


def _files() -> list[Path]:
    files = sorted(PACKAGE.rglob("*.py"))
    assert len(files) > 50, f"found only {len(files)} modules under {PACKAGE}"
    return files


def _is(name: str, target: str) -> bool:
    return name == target or name.startswith(target + ".")


def test_the_relative_imports_resolve_as_python_resolves_them() -> None:
    found = {name for name, _, _ in _imports(PACKAGE / "cli" / "cluster_cmds.py")}
    assert any(_is(name, "unwind.controlplane.dev") for name in found), sorted(found)


def test_no_production_module_imports_the_benchmarks() -> None:
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
           for path in _files() for name, line, _ in _imports(path) if _is(name, "benchmarks")]
    assert bad == []


def test_only_the_dev_commands_import_the_local_control_plane_and_only_when_they_run() -> None:
    bad = []
    for path in _files():
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("controlplane/"):
            continue
        for name, line, at_top in _imports(path):
            if not _is(name, "unwind.controlplane"):
                continue
            if relative != "cli/cluster_cmds.py":
                bad.append(f"{relative}:{line} imports {name}")
            elif at_top:
                bad.append(f"{relative}:{line} imports {name} at module level (import it in "
                           "the command that uses it)")
    assert bad == []


def _static_violations(folder: str, forbidden: tuple[str, ...]) -> list[str]:
    files = sorted((PACKAGE / folder).rglob("*.py"))
    assert files, f"no modules under {PACKAGE / folder}"
    return [f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}"
            for path in files for name, line, _ in _imports(path)
            if any(_is(name, f) for f in forbidden)]


def test_the_undo_step_and_the_upstream_client_import_no_gateway_module() -> None:
    assert _static_violations("undo", ("unwind.gateway",)) == []
    assert _static_violations("upstream", ("unwind.gateway", "unwind.undo")) == []


PROBE = """
import sys
import unwind.undo.runner, unwind.undo.local
print(sorted(m for m in sys.modules if m == "unwind.gateway" or m.startswith("unwind.gateway.")))
print("unwind.upstream.client" in sys.modules)
"""


def test_importing_the_undo_step_loads_the_upstream_client_and_no_gateway_module() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "operator")}
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.split("\n")[:2] == ["[]", "True"]
