"""What walking README as a newcomer found, offline: `unwind validate .` read test fixtures
that are invalid on purpose, and a port already taken let the laptop section's requests
reach another process's server."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import REPO, Run, run_process

BROKEN = "tool: shop.get_order\neffect: read_only\n"  # no permission: invalid
GOOD = "tool: shop.list_orders\neffect: read_only\npermission: shop:read\n"


def test_what_unwindignore_lists_is_not_read_when_a_folder_is_walked(project: Path, unwind: Run) -> None:
    (project / "manifests").mkdir()
    (project / "manifests" / "good.yaml").write_text(GOOD)
    (project / "tests" / "fixtures").mkdir(parents=True)
    (project / "tests" / "fixtures" / "broken.yaml").write_text(BROKEN)
    (project / "tests" / "contracts").mkdir()
    (project / "tests" / "contracts" / "good.test.yaml").write_text(
        "tests:\n  - name: listing changes nothing\n    tool: shop.list_orders\n    expect_plan: skip\n")
    code, _, err = unwind("validate", ".")
    assert code == 1 and "broken.yaml" in err  # without .unwindignore it is read, and fails
    (project / ".unwindignore").write_text("# fixtures, invalid on purpose\n/tests/*\n!/tests/contracts/\n")
    code, out, err = unwind("validate", ".")
    assert code == 0, err
    assert out.splitlines()[0] == "ok: 1 tool manifest valid; 1 contract test file checked"
    # a file named on the command line is read all the same
    code, _, err = unwind("validate", "tests/fixtures/broken.yaml")
    assert code == 1 and "permission" in err


def test_this_repositorys_root_validates_with_its_unwindignore() -> None:
    proc = run_process("validate", ".", cwd=REPO, env={"NO_COLOR": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok: 13 tool manifests valid (code-hosting: 10, payments: 3); "
                                  "2 contract test files checked")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other process listens on."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        yield other.getsockname()[1]


def test_a_gateway_whose_port_is_taken_exits_1_before_a_client_can_mistake_the_other_for_it(
        taken_port: int, tmp_path: Path) -> None:
    proc = run_process("gateway", "--listen", f"127.0.0.1:{taken_port}", "--manifests",
                       str(REPO / "manifests"), "--ledger-dir", str(tmp_path / "ledger"))
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        f"error: --listen 127.0.0.1:{taken_port}: cannot listen on 127.0.0.1:{taken_port}: ")
    assert "another gateway left running? stop it, or give --listen HOST:PORT" in proc.stderr


def test_a_test_upstream_whose_port_is_taken_exits_1_with_one_line(taken_port: int) -> None:
    proc = subprocess.run([sys.executable, "-m", "tests.upstream.server", "--port", str(taken_port)],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
                          env={"PYTHONPATH": f"{REPO / 'operator'}:{REPO}", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"error: cannot listen on 127.0.0.1:{taken_port}: ")
    assert "Traceback" not in proc.stderr and proc.stdout == ""
