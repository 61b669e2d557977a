"""The gateway in cluster mode: the signed bundle read through the API, the run's
EffectLedger written ahead through the status subresource, a Lease per idempotency key.

The same scenarios as tests/gateway (local mode), against the real API server, with the
gateway running as a pod's sidecar would: `unwind gateway --cluster` and the token of a
ServiceAccount bound only to the chart's ClusterRole unwind-gateway.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2
import pytest
from cluster_helpers import apply, bundle, tm, wait_for
from gateway_fixtures import (
    ClusterGateway,
    TcpProxy,
    agent_namespace,
    service_account_token,
    start_cluster_gateway,
)
from kubernetes import client
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from gateway.conftest import ROOT, UpstreamProc, env, running_upstream, stop
from gateway.test_mcp import structured
from gateway.test_rest import COMMENT, error, report
from unwind.bundle import BUNDLE_NAME
from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess
from unwind.ledger.clusterstore import compact_entry
from unwind.ledger.decide import add_decision
from unwind.ledger.entry import ApprovalDecision, Entry, now, stamp

GROUP, VERSION = "unwind.dev", "v1alpha1"


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpstreamProc]:
    with running_upstream(tmp_path_factory.mktemp("upstream")) as up:
        yield up


@pytest.fixture(autouse=True)
def fresh_upstream(upstream: UpstreamProc) -> None:
    upstream.admin("reset", {})


@pytest.fixture(scope="module")
def agent_ns(operator: OperatorProcess, k8s_api: client.ApiClient, control_plane: ControlPlane,
             upstream: UpstreamProc) -> Iterator[tuple[str, str]]:
    """A namespace of its own with the examples published; (namespace, agent token)."""
    with agent_namespace(k8s_api, control_plane, "gw", upstream.url) as made:
        yield made


@pytest.fixture(scope="module")
def gateway(agent_ns: tuple[str, str], control_plane: ControlPlane, k8s_api: client.ApiClient,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterGateway]:
    gw = start_cluster_gateway(control_plane, k8s_api, agent_ns[0], agent_ns[1],
                               tmp_path_factory.mktemp("gateway"))
    try:
        yield gw
    finally:
        stop(gw.proc)


@pytest.fixture
def run_name(request: pytest.FixtureRequest) -> str:
    return "c-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]


def write_decision(api: client.ApiClient, ns: str, run: str, entry_id: str, user: str,
                   groups: list[str], decision: str = "approve", reason: str = "") -> None:
    """Play the operator: add a decision to the entry through the status subresource, with
    the resourceVersion it read (the tally is ledger/decide.py, as the operator's)."""
    objs = client.CustomObjectsApi(api)
    made = ApprovalDecision(name=f"appr-{user}-{uuid.uuid4().hex[:6]}", user=user, groups=groups,
                            decision=decision, reason=reason,  # type: ignore[arg-type]
                            created=stamp())
    for _ in range(10):
        obj = objs.get_namespaced_custom_object(GROUP, VERSION, ns, "effectledgers", run)
        entries = obj["status"]["entries"]
        at = next(i for i, e in enumerate(entries) if e["id"] == entry_id)
        changed = add_decision(run, made, now())(Entry.model_validate(entries[at]))
        entries[at] = compact_entry(changed.to_json())  # as the operator must: see its docstring
        try:
            objs.replace_namespaced_custom_object_status(GROUP, VERSION, ns, "effectledgers", run, obj)
            return
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    raise AssertionError("the decision kept conflicting")


# ---- a call, written ahead ----


def test_a_call_answers_with_the_report_and_its_entry_is_pending_in_the_effectledger_before_the_upstream_sees_it(
        gateway: ClusterGateway, upstream: UpstreamProc, control_plane: ControlPlane,
        run_name: str) -> None:
    upstream.admin("watch", {"kube": {"server": control_plane.server, "token": control_plane.admin_token,
                                      "ca_file": str(control_plane.ca_file), "namespace": gateway.namespace}})
    r = gateway.call("github.create_comment", COMMENT, run=run_name, key="k-1")
    assert r.status_code == 200, r.text
    comment_id = r.json()["id"]
    assert report(r) == {
        "class": "reversible", "tool": "github.create_comment",
        "idempotency_key": f"{run_name}:comment-octo/hello-7-c1",  # scope run: the run is in it
        "undo": {"kind": "inverse", "tool": "github.delete_comment",
                 "arguments": {"repo": "octo/hello", "comment_id": comment_id}},
        "undo_unavailable": None, "deadline_ms": 86_400_000, "lookup": None,
        "ledger": {"name": run_name, "entry": "k-1"}, "staged": None, "warnings": []}
    [seen] = upstream.admin("requests")["requests"]
    assert [e for e in seen["ledger"] if e["ledger"] == run_name] == [
        {"ledger": run_name, "id": "k-1", "tool": "github.create_comment", "state": "pending"}]
    [page] = gateway.pages(run_name)
    assert page["spec"] == {"run": run_name, "page": 1, "owner": gateway.extra["UNWIND_ACTOR"]}
    assert page["metadata"]["labels"] == {"unwind.dev/run": run_name}
    assert page["status"]["entryCount"] == 1 and page["status"]["lastState"] == "succeeded"
    [entry] = page["status"]["entries"]
    assert entry["state"] == "succeeded" and entry["seq"] == 1
    assert entry["actor"] == f"system:serviceaccount:{gateway.namespace}:agent"
    assert entry["handle"] == {"args": {"repo": "octo/hello"}, "result": {"id": comment_id}}
    assert "looks good" not in json.dumps(entry)  # arguments are never stored whole
    got = httpx2.get(f"{gateway.url}/calls/{run_name}/k-1", timeout=10)
    assert got.status_code == 200 and got.json()["state"] == "succeeded"


def test_redacted_values_never_reach_the_effectledger(
        gateway: ClusterGateway, upstream: UpstreamProc, run_name: str) -> None:
    args = {"order_id": "r1", "amount": 300, "card_token": "tok_SECRET42"}
    upstream.behave("charges.create", "fail", status=400)
    failed = gateway.call("test.charge", args, run=run_name, key="red-1")
    assert failed.status_code == 422  # the upstream's 400: upstream_rejected
    assert "tok_SECRET42" not in failed.text and "[redacted]" in failed.text
    upstream.behave("charges.create", "ok")
    ok = gateway.call("test.charge", args, run=run_name, key="red-2")
    assert ok.status_code == 200
    stored = json.dumps(gateway.pages(run_name))
    assert "tok_SECRET42" not in stored
    assert [e["state"] for e in gateway.entries(run_name)] == ["failed", "succeeded"]


def test_a_failed_call_deletes_its_lease_so_the_key_may_run_again(
        gateway: ClusterGateway, upstream: UpstreamProc, k8s_api: client.ApiClient,
        run_name: str) -> None:
    comment = {**COMMENT, "client_id": run_name}
    leases = client.CoordinationV1Api(k8s_api)

    def key_leases() -> list[Any]:
        return [lease for lease in leases.list_namespaced_lease(gateway.namespace).items
                if (lease.metadata.annotations or {}).get("unwind.dev/run") == run_name]

    upstream.behave("comments.create", "fail", status=400)
    assert gateway.call("github.create_comment", comment, run=run_name, key="f-1").status_code == 422
    assert key_leases() == []
    upstream.behave("comments.create", "ok")
    assert gateway.call("github.create_comment", comment, run=run_name, key="f-2").status_code == 200
    [held] = key_leases()
    assert held.metadata.name.startswith("unwind-key-") and held.spec.holder_identity == "f-2"
    again = gateway.call("github.create_comment", comment, run=run_name, key="f-3")
    assert again.status_code == 409 and error(again)["entry"] == "f-2"


def test_twenty_concurrent_calls_with_one_key_through_two_gateways_call_the_upstream_once(
        gateway: ClusterGateway, upstream: UpstreamProc, agent_ns: tuple[str, str],
        control_plane: ControlPlane, k8s_api: client.ApiClient, tmp_path: Path,
        run_name: str) -> None:
    second = start_cluster_gateway(control_plane, k8s_api, agent_ns[0], agent_ns[1], tmp_path)
    comment = {**COMMENT, "client_id": "race"}
    try:
        def one(n: int) -> int:
            gw = gateway if n % 2 else second
            return gw.call("github.create_comment", comment, run=run_name, key=f"race-{n}").status_code

        with ThreadPoolExecutor(20) as pool:
            codes = list(pool.map(one, range(20)))
    finally:
        stop(second.proc)
    assert sorted(codes) == [200] + [409] * 19
    assert upstream.count("comments.create") == 1
    entries = gateway.entries(run_name)
    assert len(entries) == 20
    assert sorted(e["seq"] for e in entries) == list(range(1, 21))
    assert [e["state"] for e in entries].count("succeeded") == 1


def test_a_long_run_continues_in_linked_pages_and_every_entry_stays_readable(
        agent_ns: tuple[str, str], control_plane: ControlPlane, k8s_api: client.ApiClient,
        upstream: UpstreamProc, tmp_path: Path, run_name: str) -> None:
    small = start_cluster_gateway(control_plane, k8s_api, agent_ns[0], agent_ns[1], tmp_path,
                                  "--ledger-page-kib", "2")
    try:
        for n in range(8):
            r = small.call("github.create_issue", {"repo": "octo/hello", "title": f"t{n}"},
                           run=run_name, key=f"p-{n}")
            assert r.status_code == 200, r.text
        pages = small.pages(run_name)
        assert len(pages) >= 3
        assert [p["metadata"]["name"] for p in pages] == \
            [run_name] + [f"{run_name}.p{n}" for n in range(2, len(pages) + 1)]
        assert [p["spec"]["page"] for p in pages] == list(range(1, len(pages) + 1))
        assert [e["seq"] for e in small.entries(run_name)] == list(range(1, 9))
        first = httpx2.get(f"{small.url}/calls/{run_name}/p-0", timeout=10)
        assert first.status_code == 200 and first.json()["state"] == "succeeded"
        again = small.call("github.create_issue", {"repo": "octo/hello", "title": "t0"},
                           run=run_name, key="p-0")
        assert again.status_code == 409 and error(again)["entry"] == "p-0"
    finally:
        stop(small.proc)


def test_with_the_api_server_unreachable_a_call_gets_503_and_the_upstream_is_never_called(
        agent_ns: tuple[str, str], control_plane: ControlPlane, k8s_api: client.ApiClient,
        upstream: UpstreamProc, tmp_path: Path, run_name: str) -> None:
    host, _, port = control_plane.server.removeprefix("https://").rpartition(":")
    proxy = TcpProxy(host, int(port))
    gw = start_cluster_gateway(control_plane, k8s_api, agent_ns[0], agent_ns[1], tmp_path,
                               "--api-timeout", "2", server=proxy.address)
    try:
        issue = {"repo": "octo/hello", "title": "before"}
        assert gw.call("github.create_issue", issue, run=run_name, key="u-1").status_code == 200
        assert upstream.count() == 1
        proxy.cut()
        r = gw.call("github.create_issue", {**issue, "title": "after"}, run=run_name, key="u-2")
        assert r.status_code == 503 and error(r)["code"] == "ledger_unavailable"
        assert "nothing is called" in error(r)["message"]
        assert upstream.count() == 1
        assert gw.readyz().status_code == 200  # the bundle it has keeps serving
    finally:
        stop(gw.proc)
        proxy.close()
    assert [e["id"] for e in gw.entries(run_name)] == ["u-1"]


# ---- approvals written into the entry by someone else ----


def test_a_call_runs_once_after_two_approvals_are_written_into_its_entry(
        gateway: ClusterGateway, upstream: UpstreamProc, k8s_api: client.ApiClient,
        run_name: str) -> None:
    args = {"order_id": "ap-1", "amount": 1200}
    first = gateway.call("stripe.create_charge", args, run=run_name, key="pay-1")
    assert first.status_code == 428 and error(first)["entry"] == "pay-1"
    [entry] = gateway.entries(run_name)
    assert entry["state"] == "awaiting_approval"
    assert entry["approval"]["identities"] == "kubernetes"
    assert entry["approval"]["rules"]["roles"] == ["finance"] and entry["approval"]["rules"]["quorum"] == 2
    write_decision(k8s_api, gateway.namespace, run_name, "pay-1", "carol", ["reviewers", "finance"])
    assert gateway.call("stripe.create_charge", args, run=run_name, key="pay-1").status_code == 428
    write_decision(k8s_api, gateway.namespace, run_name, "pay-1", "dave", ["finance"])
    assert upstream.count() == 0
    ran = gateway.call("stripe.create_charge", args, run=run_name, key="pay-1")
    assert ran.status_code == 200 and ran.json()["amount"] == 1200
    assert gateway.call("stripe.create_charge", args, run=run_name, key="pay-1").status_code == 409
    assert upstream.count("charges.create") == 1
    entry = gateway.entries(run_name)[0]
    assert entry["state"] == "succeeded" and entry["approval"]["state"] == "approved"
    assert [d["user"] for d in entry["approval"]["decisions"]] == ["carol", "dave"]


def test_a_deny_written_into_the_entry_answers_403_and_nothing_runs(
        gateway: ClusterGateway, upstream: UpstreamProc, k8s_api: client.ApiClient,
        run_name: str) -> None:
    assert gateway.call("test.approve_or_deny", {"title": "d"}, run=run_name, key="d1").status_code == 428
    write_decision(k8s_api, gateway.namespace, run_name, "d1", "olga", ["ops"], "deny", "not today")
    denied = gateway.call("test.approve_or_deny", {"title": "d"}, run=run_name, key="d1")
    assert denied.status_code == 403 and error(denied)["code"] == "denied"
    assert "not today" in error(denied)["message"]
    assert upstream.count() == 0
    assert [e["state"] for e in gateway.entries(run_name)] == ["denied"]


# ---- the MCP door ----


async def test_the_mcp_door_lists_the_bundle_and_writes_the_same_entries(
        gateway: ClusterGateway, upstream: UpstreamProc, run_name: str) -> None:
    async with httpx2.AsyncClient(headers={"X-Unwind-Run": run_name}, timeout=30) as http, \
            Client(streamable_http_client(f"{gateway.url}/mcp", http_client=http)) as mcp:
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        result = await mcp.call_tool("github.create_comment", {**COMMENT, "client_id": "mcp"},
                                     meta={"idempotency_key": "mcp-1"})
        again = await mcp.call_tool("github.create_comment", {**COMMENT, "client_id": "mcp"},
                                    meta={"idempotency_key": "mcp-2"})
    comment = tools["github__create_comment"]  # served under its model-API name
    assert comment.meta is not None and comment.meta["unwind.dev/tool"] == "github.create_comment"
    assert comment.meta["unwind.dev/effect_class"] == "reversible"
    assert not result.is_error and result.meta is not None
    assert result.meta["effect"]["ledger"] == {"name": run_name, "entry": "mcp-1"}
    assert again.is_error and structured(again)["error"]["code"] == "duplicate"
    assert upstream.count() == 1
    assert [(e["id"], e["state"]) for e in gateway.entries(run_name)] == [
        ("mcp-1", "succeeded"), ("mcp-2", "refused")]


# ---- the bundle: refused when tampered with or rolled back ----


def test_a_tampered_or_rolled_back_bundle_is_refused_and_the_previous_one_keeps_serving(
        gateway: ClusterGateway, upstream: UpstreamProc, operator: OperatorProcess,
        k8s_api: client.ApiClient, control_plane: ControlPlane, run_name: str) -> None:
    ns = gateway.namespace
    core = client.CoreV1Api(k8s_api)
    older = bundle(k8s_api, ns)[BUNDLE_NAME]
    old_generation = json.loads(older["index.json"])["generation"]
    spec = next(m for m in gateway_manifests() if m["tool"] == "github.get_issue")
    apply(control_plane.kubeconfig, ns, tm("github.get-issue", {**spec, "description": "Read an issue (v2)."}))
    newer = wait_for("a newer bundle generation", lambda: (
        g := json.loads(bundle(k8s_api, ns)[BUNDLE_NAME]["index.json"])["generation"]) > old_generation and g)
    wait_for("the gateway serving it", lambda: gateway.readyz().json()["generation"] == str(newer))
    assert operator.proc is not None
    os.kill(operator.proc.pid, signal.SIGSTOP)  # the operator would rewrite the bundle at once
    try:
        cm = core.read_namespaced_config_map(BUNDLE_NAME, ns)
        blob = next(k for k in cm.data if k.startswith("m-"))
        cm.data[blob] = cm.data[blob].replace('"permission":"', '"permission":"x')
        core.replace_namespaced_config_map(BUNDLE_NAME, ns, cm)
        wait_for("the tampered bundle refused",
                 lambda: gateway.metric("unwind_gateway_catalogue_refusals_total",
                                        code="checksum_mismatch") >= 1)
        ready = gateway.readyz()
        assert ready.status_code == 200 and ready.json()["generation"] == str(newer)
        assert "checksum_mismatch" in ready.json()["problem"]
        assert f"still serving generation {newer}" in ready.json()["problem"]
        served = gateway.call("github.create_issue", {"repo": "octo/hello", "title": "still"},
                              run=run_name)
        assert served.status_code == 200

        cm = core.read_namespaced_config_map(BUNDLE_NAME, ns)
        cm.data = older  # an old bundle, signed and valid, put back
        core.replace_namespaced_config_map(BUNDLE_NAME, ns, cm)
        wait_for("the old bundle refused",
                 lambda: gateway.metric("unwind_gateway_catalogue_refusals_total", code="rollback") >= 1)
        assert gateway.readyz().json()["generation"] == str(newer)
        assert "rollback" in gateway.readyz().json()["problem"]
    finally:
        os.kill(operator.proc.pid, signal.SIGCONT)
    rewritten = wait_for("the operator's fresh bundle served", lambda: (
        body := gateway.readyz().json())["problem"] is None and int(body["generation"]) > newer and body,
        timeout=60)
    assert rewritten["ready"] is True


def gateway_manifests() -> list[dict[str, Any]]:
    from gateway_fixtures import example_manifests
    return [m["spec"] for m in example_manifests("http://127.0.0.1:1")]


def test_the_gateway_refuses_to_start_in_cluster_mode_outside_a_pod(tmp_path: Path) -> None:
    bare = {k: v for k, v in env().items() if not k.startswith("KUBERNETES_")}
    r = subprocess.run([sys.executable, "-m", "unwind.cli.main", "gateway", "--cluster"],
                       cwd=ROOT, env=bare, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "KUBERNETES_SERVICE_HOST" in r.stderr and "--manifests" in r.stderr


def test_a_gateway_whose_rbac_is_revoked_mid_run_answers_503_naming_the_role(
        agent_ns: tuple[str, str], control_plane: ControlPlane, k8s_api: client.ApiClient,
        upstream: UpstreamProc, tmp_path: Path, run_name: str) -> None:
    ns = agent_ns[0]
    client.CoreV1Api(k8s_api).create_namespaced_service_account(ns, {"metadata": {"name": "revoked"}})
    rbac = client.RbacAuthorizationV1Api(k8s_api)
    rbac.create_namespaced_role_binding(ns, {
        "metadata": {"name": "revoked-gateway"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "unwind-gateway"},
        "subjects": [{"kind": "ServiceAccount", "name": "revoked", "namespace": ns}]})
    token = service_account_token(k8s_api, ns, "revoked")
    gw = start_cluster_gateway(control_plane, k8s_api, ns, token, tmp_path)
    try:
        issue = {"repo": "octo/hello", "title": "granted"}
        assert gw.call("github.create_issue", issue, run=run_name, key="g-1").status_code == 200
        rbac.delete_namespaced_role_binding("revoked-gateway", ns)

        def denied() -> bool:
            review = client.AuthorizationV1Api(k8s_api).create_subject_access_review({
                "spec": {"user": f"system:serviceaccount:{ns}:revoked",
                         "resourceAttributes": {"namespace": ns, "group": "unwind.dev",
                                                "resource": "effectledgers", "verb": "get"}}})
            return not review.status.allowed
        wait_for("the revocation to take effect", denied)
        r = gw.call("github.create_issue", {**issue, "title": "revoked"}, run=run_name, key="g-2")
        assert r.status_code == 503 and error(r)["code"] == "ledger_unavailable"
        assert "unwind-gateway" in error(r)["message"]
        assert upstream.count() == 1
    finally:
        stop(gw.proc)
