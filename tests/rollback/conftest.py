"""The rollback tests run the gateway and the test upstream as processes, as the gateway
tests do (their fixtures are reused), with tests/rollback/extra.yaml added to the set."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway import conftest as gw
from gateway.conftest import ROOT, GatewayProc, UpstreamProc, start_gateway, stop
from unwind.cli.main import main
from unwind.controlplane.kubenode import EXAMPLES_UPSTREAM

HERE = Path(__file__).parent
# The gateway tests' fixtures, found by pytest under these names.
upstream = gw.upstream
fresh_upstream = gw.fresh_upstream
run_name = gw.run_name
__all__ = ["GatewayProc", "UpstreamProc", "fresh_upstream", "run_name", "unwind", "upstream"]


@pytest.fixture(scope="session")
def manifests(upstream: UpstreamProc, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("manifests")
    sources = [*sorted((ROOT / "manifests").glob("*.yaml")), ROOT / "tests/gateway/extra.yaml",
               HERE / "extra.yaml"]
    for src in sources:
        text = src.read_text().replace("http://127.0.0.1:8788", upstream.url).replace(EXAMPLES_UPSTREAM, upstream.url)
        text = text.replace("timeout_ms: 10s", "timeout_ms: 2s").replace("timeout_ms: 30s", "timeout_ms: 2s")
        (out / f"{src.parent.name}-{src.name}").write_text(text)
    return out


@pytest.fixture(scope="module")
def gateway(manifests: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("gateway")
    gw = start_gateway(manifests, base / "ledger", base)
    try:
        yield gw
    finally:
        stop(gw.proc)


class Ran:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


def unwind(*argv: str | Path) -> Ran:
    """The CLI in this process (the same code `unwind` runs), its output captured."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return Ran(code, out.getvalue(), err.getvalue())
