"""Chaos in cluster mode: `unwind gateway --cluster` killed (SIGKILL) at random moments while
ten clients call it, its ledger the run's EffectLedgers and a Lease per key.

What must hold whatever the moment: the upstream never sees a call whose ``pending`` entry
the API server did not already hold (the upstream reads the EffectLedgers at each request
it gets, before answering), and no entry is lost: every call the upstream saw, and every
call answered 200, is in the ledger after the kills (answered 200: ``succeeded``), each
id once, in one unbroken ``seq``. The calls are keyed (the comment's key is rendered from
its client_id), so each takes its Lease together with its pending write.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from gateway_fixtures import (
    ClusterGateway,
    agent_namespace,
    start_cluster_gateway,
)
from kubernetes import client

from gateway.chaos import check_nothing_lost, comment_until_stopped
from gateway.conftest import UpstreamProc, running_upstream
from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess

ROUNDS = 3


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamProc]:
    with running_upstream(tmp_path_factory.mktemp("upstream")) as up:
        yield up


@pytest.fixture(scope="module")
def agent_ns(operator: OperatorProcess, k8s_api: client.ApiClient, control_plane: ControlPlane,
             upstream: UpstreamProc) -> Iterator[tuple[str, str]]:
    with agent_namespace(k8s_api, control_plane, "chaos", upstream.url) as made:
        yield made


def test_a_cluster_gateway_killed_at_random_moments_loses_no_entry_and_calls_nothing_unwritten(
        agent_ns: tuple[str, str], control_plane: ControlPlane, k8s_api: client.ApiClient,
        upstream: UpstreamProc, tmp_path_factory: pytest.TempPathFactory) -> None:
    namespace, token = agent_ns
    upstream.admin("reset", {})
    upstream.admin("watch", {"kube": {"server": control_plane.server,
                                      "token": control_plane.admin_token,
                                      "ca_file": str(control_plane.ca_file),
                                      "namespace": namespace}})
    rng = random.Random(20)  # seeded, so a failure can be replayed
    answered: dict[str, int] = {}
    work = tmp_path_factory.mktemp("chaos")
    gw: ClusterGateway | None = None
    for round_ in range(ROUNDS):
        gw = start_cluster_gateway(control_plane, k8s_api, namespace, token, work)
        halt = threading.Event()
        clients = [threading.Thread(target=comment_until_stopped, args=(gw, f"r{round_}-c{c}", answered, halt))
                   for c in range(10)]
        for t in clients:
            t.start()
        time.sleep(rng.uniform(0.5, 2.5))
        gw.proc.kill()  # SIGKILL: no cleanup of any kind
        gw.proc.wait(10)
        halt.set()
        for t in clients:
            t.join(30)
    assert gw is not None
    pages = sorted(gw.pages("chaos"), key=lambda p: int(p["spec"]["page"]))
    entries: list[dict[str, Any]] = [e for p in pages for e in (p.get("status") or {}).get("entries", [])]
    check_nothing_lost(entries, upstream.admin("requests")["requests"], answered)
