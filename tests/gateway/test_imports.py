"""The sidecar's memory budget: the gateway and the ledger never import the Kubernetes client."""

from __future__ import annotations

import subprocess
import sys

from .conftest import ROOT, env

PROBE = """
import sys
from unwind.cli.main import build_parser
build_parser("gateway")
import unwind.gateway.app, unwind.cli.gateway_cmds
import unwind.ledger.filestore, unwind.ledger.decide, unwind.ledger.memory
import unwind.gateway.kube, unwind.gateway.bundle_catalogue
import unwind.ledger.clusterstore, unwind.bundle
print(sorted(m for m in sys.modules if m.split(".")[0] in ("kubernetes", "kopf")))
"""


def test_the_gateway_imports_neither_the_kubernetes_client_nor_kopf_in_either_mode() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env(), capture_output=True,
                         text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"
