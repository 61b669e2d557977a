"""Unwind on a real node: `unwind dev up` as README runs it, every part in containers.

One dev cluster for the module (the control plane, a kubelet with containerd and runc, the
scheduler and kube-proxy, the project's image imported into the node's containerd), started
with :func:`unwind.controlplane.dev.up` exactly as ``scripts/dev-up.sh`` does. On it:

- the operator is the chart's Deployment of the image (two replicas; a killed leader pod
  hands over to the other);
- README's story (manifests/, examples/demo-agent.yaml unchanged, plan, rollback Jobs) runs
  in containers, and the demo pod completes;
- a labelled pod that uses the default token mount (kube-api-access-*, as clusters from 1.22
  on give, no feature gate) is injected, and its agent finds no token;
- a pod of the demo agent's ServiceAccount without the label is refused by the API server
  (ledger, Secret, bundle) and by the operator's token exchange;
- the gateway is a native sidecar (an init container with ``restartPolicy: Always``): an agent
  run as a Job completes when its agent exits, without ``/quitquitquit``, and the kubelet
  stops the gateway after the agent, which still finishes and records the call in flight;
- Pod Security admission enforces "restricted" on the examples' namespaces: the injected
  pods and the undo Jobs are admitted, an agent that breaks the profile is refused.

One node runs per machine (kube-proxy owns the host's KUBE-* chains), so the module's
cluster is stopped before any other test starts one.
"""

from __future__ import annotations

import copy
import json
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import wait_for
from kubernetes import client, config

from unwind.controlplane import kubenode, nodeclean
from unwind.controlplane.build import PARTS, kubectl_binary
from unwind.controlplane.dev import (
    EXCHANGE_URL,
    OPERATOR_DEPLOYMENT,
    OPERATOR_NAMESPACE,
    ROOT,
    UPSTREAM_PORT,
    Started,
    down,
    kubectl,
    up,
)
from unwind.operator.inject import CONTAINER

SA_TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Started]:
    workdir = tmp_path_factory.mktemp("dev")
    try:
        started = up(workdir)
    except BaseException:
        down(workdir)
        raise
    try:
        yield started
    finally:
        down(workdir)
        left = nodeclean.clean_host(started.control_plane.node_dirs, started.control_plane.node_dirs.root / "host.json")
        assert left == [], left


@pytest.fixture(scope="module")
def kc(dev: Started) -> Path:
    return dev.control_plane.kubeconfig


@pytest.fixture(scope="module")
def api(kc: Path) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(kc))
    try:
        yield api
    finally:
        api.close()


@pytest.fixture(scope="module")
def manifests(kc: Path) -> None:
    kubectl(kc, "apply", "-f", str(ROOT / "manifests"))
    kubectl(kc, "wait", "--for=condition=Ready", "toolmanifests", "--all", "-A", "--timeout=120s")


def pod_phase(api: client.ApiClient, namespace: str, name: str) -> str:
    return str(client.CoreV1Api(api).read_namespaced_pod(name, namespace).status.phase)


def finished(api: client.ApiClient, namespace: str, name: str, timeout: float = 120) -> str:
    return str(wait_for(f"pod {namespace}/{name} finished", lambda: (
        p := pod_phase(api, namespace, name)) in ("Succeeded", "Failed") and p, timeout=timeout))


def plugin(kc: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(ROOT / ".venv" / "bin" / "kubectl-unwind"), *args, f"--kubeconfig={kc}"],
                          capture_output=True, text=True, timeout=300)


def test_the_node_is_ready_with_containerd_and_the_operator_runs_as_the_charts_deployment(
        kc: Path, api: client.ApiClient) -> None:
    control_plane, node = (part.kube_version for part in PARTS)
    said = kubectl(kc, "version")
    assert f"Client Version: v{control_plane}" in said and f"Server Version: v{control_plane}" in said
    assert kubectl(kc, "get", "nodes").splitlines()[1].split()[4] == f"v{node}"
    nodes = kubectl(kc, "get", "nodes", "-o", "wide").splitlines()
    assert nodes[0].split()[:2] == ["NAME", "STATUS"]
    row = nodes[1].split()
    assert row[0] == kubenode.NODE_NAME and row[1] == "Ready"
    assert row[5] == kubenode.NODE_ADDRESS and nodes[1].rstrip().split()[-1].startswith("containerd://")
    pods = client.CoreV1Api(api).list_namespaced_pod(OPERATOR_NAMESPACE).items
    operators = [p for p in pods if p.metadata.name.startswith(OPERATOR_DEPLOYMENT)]
    assert len(operators) == 2, [p.metadata.name for p in pods]  # the chart's default replicas
    for pod in operators:
        assert pod.status.phase == "Running" and pod.spec.node_name == kubenode.NODE_NAME
        (status,) = pod.status.container_statuses
        assert status.ready and status.container_id.startswith("containerd://")
        assert status.image.endswith("unwind:dev")
    # kubectl logs goes through the kubelet, which asks the API server who may read them
    assert kubectl(kc, "-n", OPERATOR_NAMESPACE, "logs", operators[0].metadata.name).strip()
    # forwarding stays off: nothing a pod sends is routed off this machine
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text().strip() == "0"


def test_the_readme_story_runs_in_containers_and_the_demo_pod_completes(
        kc: Path, api: client.ApiClient, manifests: None) -> None:
    kubectl(kc, "apply", "-f", str(ROOT / "examples" / "demo-agent.yaml"))
    phase = finished(api, "code-hosting", "demo-run")
    said = kubectl(kc, "-n", "code-hosting", "logs", "demo-run", "-c", "agent")
    gateway_log = kubectl(kc, "-n", "code-hosting", "logs", "demo-run", "-c", CONTAINER, check=False)
    assert phase == "Succeeded", said + gateway_log
    assert "github.create_comment: 200 reversible, ledger demo-run entry comment-1; " \
           "undo: inverse github.delete_comment" in said, said
    assert "github.create_issue: 200 compensable, ledger demo-run entry issue-1" in said
    assert "github.create_release: 200 irreversible" in said
    pod = client.CoreV1Api(api).read_namespaced_pod("demo-run", "code-hosting")
    # the gateway is a native sidecar: the pod ended because its agent did, then the
    # kubelet stopped the gateway
    assert {s.name: s.state.terminated.exit_code for s in pod.status.container_statuses} == {"agent": 0}
    (gateway,) = pod.status.init_container_statuses
    assert gateway.name == CONTAINER and gateway.state.terminated is not None
    assert all(s.container_id.startswith("containerd://")
               for s in [*pod.status.container_statuses, gateway])
    # under Pod Security "restricted" (manifests/00-namespaces.yaml): the pod with its
    # injected gateway was admitted, and so were the undo Jobs' pods below
    labels = client.CoreV1Api(api).read_namespace("code-hosting").metadata.labels
    assert labels["pod-security.kubernetes.io/enforce"] == "restricted"

    plan = plugin(kc, "plan", "ledger/demo-run", "-n", "code-hosting", "--json")
    assert plan.returncode == 0, plan.stderr
    assert [s["undo_tool"] for s in json.loads(plan.stdout)["steps"]] == [
        "github.delete_release", "github.close_issue", "github.delete_comment"]
    ran = plugin(kc, "rollback", "ledger/demo-run", "-n", "code-hosting", "--reason", "the agent misbehaved",
                 "--watch", "--timeout", "240s")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "ledger/demo-run: rolled back: 3 steps ran" in ran.stdout, ran.stdout
    ledger = json.loads(kubectl(kc, "-n", "code-hosting", "get", "ledger", "demo-run", "-o", "json"))
    assert {c["type"]: c["status"] for c in ledger["status"]["conditions"]}["RolledBack"] == "True"
    events = wait_for("the RolledBack Event", lambda: "RolledBack" in (out := kubectl(
        kc, "events", "-n", "code-hosting", "--for", "effectledger/demo-run")) and out, timeout=30)
    assert "Planned" in events and "StepSucceeded" in events, events
    jobs = client.CoreV1Api(api).list_namespaced_pod("code-hosting", label_selector="job-name").items
    assert len(jobs) >= 3
    for job_pod in jobs:  # each undo ran in a container of the image, and ended well
        (status,) = job_pod.status.container_statuses
        assert status.container_id.startswith("containerd://") and status.image.endswith("unwind:dev")
        assert status.state.terminated is not None
    # Pods came and went on the bridge: its address stayed (a bridge takes its lowest port's
    # MAC otherwise, the other pods' ARP entries went stale, and both operator replicas were
    # killed by their liveness probes), and the operator never restarted.
    assert Path(f"/sys/class/net/{kubenode.BRIDGE}/address").read_text().strip() == kubenode.BRIDGE_MAC
    operators = client.CoreV1Api(api).list_namespaced_pod(OPERATOR_NAMESPACE).items
    assert {p.metadata.name: p.status.container_statuses[0].restart_count for p in operators} == {
        p.metadata.name: 0 for p in operators}


def demo_account() -> list[dict[str, Any]]:
    """examples/demo-agent.yaml's ServiceAccount (not its Pod)."""
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "demo-agent.yaml").read_text()) if d]
    return [d for d in docs if d["kind"] != "Pod"]


RESTRICTED = {"runAsNonRoot": True, "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
              "seccompProfile": {"type": "RuntimeDefault"}}


def upstream_requests() -> list[dict[str, Any]]:
    """Every request the examples' upstream (`unwind dev up` started it, on 127.0.0.1 too)
    has answered: its own record of what happened."""
    with urllib.request.urlopen(f"http://127.0.0.1:{UPSTREAM_PORT}/_admin/requests", timeout=10) as r:
        return list(json.loads(r.read())["requests"])


def comment_status(comment_id: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{UPSTREAM_PORT}/comments/{comment_id}", timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_a_rollback_started_while_the_demo_agent_still_calls_undoes_every_effect_exactly_once(
        kc: Path, api: client.ApiClient, manifests: None) -> None:
    """README's demo agent, calling on (a comment every 0.4 s), and `kubectl unwind rollback
    --watch` asked for in the middle of it: the run is fenced (the agent's next call is
    refused, naming the rollback), the call in flight is waited for, and every comment the
    upstream made is deleted exactly once, by the upstream's own records."""
    demo = [d for d in yaml.safe_load_all((ROOT / "examples" / "demo-agent.yaml").read_text()) if d]
    name = f"story-{uuid.uuid4().hex[:6]}"
    pod = copy.deepcopy(demo[-1])
    pod["metadata"]["name"] = name
    calls = [{"tool": "github.create_comment", "key": f"{name}-{n}", "pause": 0.4,
              "arguments": {"repo": "octo/hello", "issue": 7, "client_id": f"{name}-{n}", "body": f"comment {n}"}}
             for n in range(60)]
    pod["spec"]["containers"][0]["env"] = [{"name": "UNWIND_DEMO_CALLS", "value": json.dumps(calls)}]
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all([*demo[:-1], pod]))

    def entries() -> list[dict[str, Any]]:
        out = kubectl(kc, "-n", "code-hosting", "get", "ledger", name, "-o", "json", check=False)
        return list((json.loads(out).get("status") or {}).get("entries") or []) if out.startswith("{") else []
    wait_for("the agent calling", lambda: len(entries()) >= 3, timeout=180)
    ran = plugin(kc, "rollback", f"ledger/{name}", "-n", "code-hosting", "--reason", "stop it",
                 "--watch", "--timeout", "300s")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"ledger/{name}: rolled back:" in ran.stdout, ran.stdout
    phase = finished(api, "code-hosting", name)
    said = kubectl(kc, "-n", "code-hosting", "logs", name, "-c", "agent")
    assert phase == "Failed", said  # the agent stops at the refusal
    refused = [line for line in said.splitlines() if " 409 rolled_back" in line]
    assert len(refused) == 1 and f"run {name} is being rolled back" in refused[0], said

    ledger = json.loads(kubectl(kc, "-n", "code-hosting", "get", "ledger", name, "-o", "json"))
    made = ledger["status"]["entries"]
    assert made and {e["state"] for e in made} == {"undone"}, [(e["id"], e["state"]) for e in made]
    assert all(p.get("status", {}).get("fence") for p in [ledger])
    requests = upstream_requests()
    created = [r for r in requests if r["route"] == "comments.create"
               and str(r["arguments"].get("client_id", "")).startswith(f"{name}-")]
    assert sorted(r["arguments"]["client_id"] for r in created) == sorted(e["id"] for e in made)
    ids = [e["handle"]["result"]["id"] for e in made]
    deletes = Counter(r["path"] for r in requests if r["route"] == "comments.delete")
    assert {i: deletes[f"/comments/{i}"] for i in ids} == dict.fromkeys(ids, 1)
    assert {i: comment_status(i) for i in ids} == dict.fromkeys(ids, 404)


def agent_pod(name: str, namespace: str, script: str, *, labelled: bool = True) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"unwind.dev/inject": "true"} if labelled else {}},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "agent", "image": "unwind:dev", "command": ["python", "-c", script],
                "securityContext": dict(RESTRICTED)}]}}


LOOK_FOR_TOKEN = f"""
import os
print("TOKEN", "present" if os.path.exists("{SA_TOKEN_DIR}/token") else "absent")
"""


READ_ROUTES = """
import socket, struct
for line in open("/proc/net/route").read().splitlines()[1:]:
    f = line.split()
    ip = lambda h: socket.inet_ntoa(struct.pack("<I", int(h, 16)))
    print("ROUTE", ip(f[1]), ip(f[7]), ip(f[2]))
"""


def test_a_pod_has_no_default_route_only_the_pod_and_service_ranges(kc: Path, api: client.ApiClient) -> None:
    # nothing a pod sends can be routed off this machine: it has no route to anywhere else
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump(agent_pod("routes", "default", READ_ROUTES,
                                                                         labelled=False)))
    assert finished(api, "default", "routes") == "Succeeded"
    routes = sorted(line.split()[1:] for line in kubectl(kc, "-n", "default", "logs", "routes").splitlines()
                    if line.startswith("ROUTE"))
    assert routes == sorted([["10.244.0.0", "255.255.255.0", "0.0.0.0"],
                             ["10.0.0.0", "255.255.255.0", kubenode.NODE_ADDRESS]]), routes


def test_a_pod_with_the_default_token_mount_is_injected_and_its_agent_holds_no_token(
        kc: Path, api: client.ApiClient, manifests: None) -> None:
    core = client.CoreV1Api(api)
    plain = agent_pod("plain", "code-hosting", LOOK_FOR_TOKEN, labelled=False)
    labelled = agent_pod("labelled", "code-hosting", LOOK_FOR_TOKEN)
    # a native sidecar starts the agent only once the gateway is ready: the demo's
    # ServiceAccount, in the namespace whose bundle the gateway reads
    labelled["spec"]["serviceAccountName"] = "demo-agent"
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all([*demo_account(), plain]))
    # what the ServiceAccount admission plugin gives a pod here, as on clusters from 1.22 on
    volumes = core.read_namespaced_pod("plain", "code-hosting").spec.volumes
    assert any(v.name.startswith("kube-api-access-") and v.projected for v in volumes), volumes
    assert finished(api, "code-hosting", "plain") == "Succeeded"
    assert "TOKEN present" in kubectl(kc, "-n", "code-hosting", "logs", "plain")

    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all([labelled]))
    pod = core.read_namespaced_pod("labelled", "code-hosting")
    assert CONTAINER in [c.name for c in [*pod.spec.containers, *(pod.spec.init_containers or [])]]
    agent = next(c for c in pod.spec.containers if c.name == "agent")
    assert not any(m.mount_path == SA_TOKEN_DIR for m in agent.volume_mounts or [])
    said = wait_for("the agent's answer", lambda: "TOKEN" in (
        out := kubectl(kc, "-n", "code-hosting", "logs", "labelled", "-c", "agent", check=False)) and out,
        timeout=90)
    assert "TOKEN absent" in said
    core.delete_namespaced_pod("labelled", "code-hosting", grace_period_seconds=0)


TRY_AS_THE_AGENT = f"""
import json, ssl, urllib.error, urllib.request
token = open("{SA_TOKEN_DIR}/token").read()
api = ssl.create_default_context(cafile="{SA_TOKEN_DIR}/ca.crt")
def ask(what, method, url, body, context, bearer):
    request = urllib.request.Request(url, method=method, data=body, headers={{
        "Authorization": "Bearer " + bearer, "Content-Type": "application/json"}})
    try:
        with urllib.request.urlopen(request, context=context, timeout=20) as r:
            print(what, r.status)
    except urllib.error.HTTPError as e:
        print(what, e.code, e.read().decode()[:300].replace(chr(10), " "))
base = "https://10.0.0.1:443"
ledger = json.dumps({{"apiVersion": "unwind.dev/v1alpha1", "kind": "EffectLedger",
                     "metadata": {{"name": "forged"}}, "spec": {{"run": "forged"}}}}).encode()
ask("LEDGER", "POST", base + "/apis/unwind.dev/v1alpha1/namespaces/code-hosting/effectledgers", ledger, api, token)
ask("SECRET", "GET", base + "/api/v1/namespaces/code-hosting/secrets/github-token", None, api, token)
ask("BUNDLE", "GET", base + "/api/v1/namespaces/code-hosting/configmaps/unwind-bundle", None, api, token)
unverified = ssl.create_default_context()
unverified.check_hostname, unverified.verify_mode = False, ssl.CERT_NONE
ask("EXCHANGE", "POST", "{EXCHANGE_URL}/v1/gateway-token", b"", unverified, open("/var/run/secrets/op/token").read())
"""


def test_a_pod_of_the_agents_service_account_without_the_label_can_neither_write_a_ledger_nor_read_a_secret(
        kc: Path, api: client.ApiClient, manifests: None) -> None:
    # issue 29, item 10, on the node: the agent's ServiceAccount holds no Unwind right, and
    # its token for the operator's audience buys nothing from a pod the webhook did not inject
    outsider = agent_pod("outsider", "code-hosting", TRY_AS_THE_AGENT, labelled=False)
    outsider["spec"]["serviceAccountName"] = "demo-agent"
    outsider["spec"]["volumes"] = [{"name": "op", "projected": {"sources": [
        {"serviceAccountToken": {"path": "token", "audience": "unwind-operator", "expirationSeconds": 600}}]}}]
    outsider["spec"]["containers"][0]["volumeMounts"] = [{"name": "op", "mountPath": "/var/run/secrets/op"}]
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "github-token", "namespace": "code-hosting"},
              "stringData": {"token": "s3cret"}}
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all([*demo_account(), secret, outsider]))
    try:
        assert finished(api, "code-hosting", "outsider") == "Succeeded"
        said = {line.split()[0]: line.split(maxsplit=2)[1:] for line in
                kubectl(kc, "-n", "code-hosting", "logs", "outsider").splitlines() if line.split()}
        assert said["LEDGER"][0] == "403" and "demo-agent" in said["LEDGER"][1], said
        assert said["SECRET"][0] == "403" and said["BUNDLE"][0] == "403", said
        assert said["EXCHANGE"][0] == "403" and "is not labelled unwind.dev/inject=true" in said["EXCHANGE"][1], said
    finally:
        kubectl(kc, "-n", "code-hosting", "delete", "pod/outsider", "secret/github-token", "--wait=false",
                check=False)


def test_an_agent_run_as_a_job_completes_with_its_gateway(kc: Path, api: client.ApiClient, manifests: None) -> None:
    demo = [d for d in yaml.safe_load_all((ROOT / "examples" / "demo-agent.yaml").read_text()) if d]
    pod = demo[-1]
    name = f"agent-job-{uuid.uuid4().hex[:6]}"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "code-hosting"},
           "spec": {"backoffLimit": 0, "template": {
               "metadata": {"labels": pod["metadata"]["labels"],
                            "annotations": {"unwind.dev/run": name}},
               "spec": {**pod["spec"], "containers": [{**pod["spec"]["containers"][0], "env": [{
                   "name": "UNWIND_DEMO_CALLS", "value": json.dumps([{
                       "tool": "github.create_comment", "key": "job-comment",
                       "arguments": {"repo": "octo/hello", "issue": 7, "client_id": name, "body": "from a Job"}}])}]}]}}}}
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all([job]))
    batch = client.BatchV1Api(api)
    done = wait_for(f"Job {name} to end", lambda: next((
        c.type for c in (batch.read_namespaced_job(name, "code-hosting").status.conditions or [])
        if c.status == "True" and c.type in ("Complete", "Failed")), None), timeout=150)
    assert done == "Complete"
    ledger = json.loads(kubectl(kc, "-n", "code-hosting", "get", "ledger", name, "-o", "json"))
    assert [(e["id"], e["state"]) for e in ledger["status"]["entries"]] == [("job-comment", "succeeded")]


def test_killing_the_leader_pod_hands_the_reconcile_over_to_the_other_replica(
        kc: Path, api: client.ApiClient, manifests: None) -> None:
    coord = client.CoordinationV1Api(api)

    def holder() -> str:
        return str(coord.read_namespaced_lease("unwind-operator", OPERATOR_NAMESPACE).spec.holder_identity or "")

    first = wait_for("a leader", holder, timeout=60)
    pods = [p.metadata.name for p in client.CoreV1Api(api).list_namespaced_pod(OPERATOR_NAMESPACE).items]
    leader_pod = next(p for p in pods if p in first)
    client.CoreV1Api(api).delete_namespaced_pod(leader_pod, OPERATOR_NAMESPACE, grace_period_seconds=0)
    second = wait_for("another leader", lambda: (h := holder()) and leader_pod not in h and h, timeout=90)
    assert second != first
    # the new leader reconciles: a manifest applied now becomes Ready
    name = f"handover-{uuid.uuid4().hex[:6]}"
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump({
        "apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
        "metadata": {"name": name, "namespace": "code-hosting"},
        "spec": {"tool": f"test.{name.replace('-', '_')}", "effect": "read_only", "permission": "repo:read",
                 "lifecycle": "approved",
                 "upstream": {"url": "http://10.0.0.88:8788/issues/1", "method": "GET"}}}))
    started = time.monotonic()
    kubectl(kc, "-n", "code-hosting", "wait", "--for=condition=Ready", f"toolmanifest/{name}", "--timeout=90s")
    assert time.monotonic() - started < 90


# One call whose upstream answers after 3 s, which the agent does not wait for: it gives up
# after 1 s and exits, without POST /quitquitquit. The gateway, stopped by the kubelet after
# the agent, still has the call in flight.
LEAVES_A_CALL_IN_FLIGHT = """
import json, urllib.request
body = json.dumps({"arguments": {"repo": "octo/hello", "issue": 7, "client_id": "in-flight",
                                 "body": "sent as the agent leaves"}}).encode()
req = urllib.request.Request("http://127.0.0.1:8787/call/github.create_comment", data=body, method="POST",
                             headers={"Content-Type": "application/json", "Idempotency-Key": "in-flight-1"})
try:
    urllib.request.urlopen(req, timeout=1)
    print("ANSWERED")
except OSError as exc:
    print("LEFT", type(exc).__name__)
"""


def behave(route: str, mode: str, **extra: Any) -> None:
    """Tell the examples' upstream (which `unwind dev up` runs on this machine) how to answer."""
    import urllib.request

    body = json.dumps({"route": route, "mode": mode, **extra}).encode()
    urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{UPSTREAM_PORT}/_admin/behave", data=body,
                                                  headers={"Content-Type": "application/json"}), timeout=10)


def test_an_agent_job_completes_when_its_agent_exits_and_its_gateway_finishes_the_call_in_flight(
        kc: Path, api: client.ApiClient, manifests: None) -> None:
    demo = [d for d in yaml.safe_load_all((ROOT / "examples" / "demo-agent.yaml").read_text()) if d]
    template = demo[-1]
    name = f"in-flight-{uuid.uuid4().hex[:6]}"
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": "code-hosting"},
           "spec": {"backoffLimit": 0, "template": {
               "metadata": {"labels": template["metadata"]["labels"], "annotations": {"unwind.dev/run": name}},
               "spec": {**template["spec"], "containers": [{
                   **template["spec"]["containers"][0], "env": [],
                   "command": ["python", "-c", LEAVES_A_CALL_IN_FLIGHT]}]}}}}
    behave("comments.create", "slow", delay=3)
    try:
        kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump(job))
        batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
        done = wait_for(f"Job {name} to end", lambda: next((
            c.type for c in (batch.read_namespaced_job(name, "code-hosting").status.conditions or [])
            if c.status == "True" and c.type in ("Complete", "Failed")), None), timeout=150)
    finally:
        behave("comments.create", "ok")
    (pod,) = core.list_namespaced_pod("code-hosting", label_selector=f"job-name={name}").items
    assert done == "Complete", kubectl(kc, "-n", "code-hosting", "describe", "pod", pod.metadata.name)
    assert "LEFT" in kubectl(kc, "-n", "code-hosting", "logs", pod.metadata.name, "-c", "agent")
    # a native sidecar, so nothing told the gateway to quit: the kubelet stopped it after the agent
    (sidecar,) = pod.spec.init_containers
    assert sidecar.name == CONTAINER and sidecar.restart_policy == "Always"
    assert "UNWIND_QUIT" not in {e.name for e in sidecar.env}
    (agent,), (gateway,) = pod.status.container_statuses, pod.status.init_container_statuses
    assert gateway.state.terminated.finished_at >= agent.state.terminated.finished_at
    # and before it went, the call in flight was answered and its end recorded
    ledger = json.loads(kubectl(kc, "-n", "code-hosting", "get", "ledger", name, "-o", "json"))
    assert [(e["id"], e["state"]) for e in ledger["status"]["entries"]] == [("in-flight-1", "succeeded")]


def test_pod_security_restricted_refuses_an_agent_that_breaks_it_and_names_the_agents_container(
        kc: Path, api: client.ApiClient, manifests: None) -> None:
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all(demo_account()))
    pod = agent_pod("unrestricted", "code-hosting", LOOK_FOR_TOKEN)
    pod["spec"]["serviceAccountName"] = "demo-agent"
    del pod["spec"]["containers"][0]["securityContext"]
    proc = subprocess.run([kubectl_binary(), f"--kubeconfig={kc}", "apply", "-f", "-"], input=yaml.safe_dump(pod),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in proc.stderr, proc.stderr
    assert 'container "agent" must set securityContext.allowPrivilegeEscalation=false' in proc.stderr
    assert CONTAINER not in proc.stderr  # the injected gateway meets the profile
    # the same pod meeting the profile is admitted, with its gateway
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump({**pod, "metadata": {**pod["metadata"], "name": "restricted"},
            "spec": {**pod["spec"], "containers": [{**pod["spec"]["containers"][0], "securityContext": RESTRICTED}]}}))
    assert finished(api, "code-hosting", "restricted") == "Succeeded"


CALLS_AROUND_A_RESTART = """
import json, time, urllib.error, urllib.request
def call():
    body = json.dumps({"arguments": {"repo": "octo/hello", "issue": 7, "client_id": "%(name)s",
                                     "body": "once, whatever restarts"}}).encode()
    req = urllib.request.Request("http://127.0.0.1:8787/call/github.create_comment", data=body, method="POST",
                                 headers={"Content-Type": "application/json", "Idempotency-Key": "restart-1"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
print("FIRST", call(), flush=True)
while not __import__("os").path.exists("/tmp/again"):
    time.sleep(0.5)
for _ in range(120):  # the agent's rule: retry the same key while the gateway is away
    try:
        print("AGAIN", call(), flush=True)
        break
    except OSError as exc:
        print("AWAY", type(exc).__name__, flush=True)
        time.sleep(1)
time.sleep(3600)
"""


def test_the_gateways_probes_are_http_gets_its_status_port_answers_only_health_and_a_restart_runs_nothing_twice(
        kc: Path, api: client.ApiClient, manifests: None) -> None:
    demo = [d for d in yaml.safe_load_all((ROOT / "examples" / "demo-agent.yaml").read_text()) if d]
    template = demo[-1]
    name = f"restart-{uuid.uuid4().hex[:6]}"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": "code-hosting", "labels": template["metadata"]["labels"],
                        "annotations": {"unwind.dev/run": name}},
           "spec": {**template["spec"], "restartPolicy": "Never", "containers": [{
               **template["spec"]["containers"][0], "env": [],
               "command": ["python", "-c", CALLS_AROUND_A_RESTART % {"name": name}]}]}}
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all([*demo_account(), pod]))
    core = client.CoreV1Api(api)
    try:
        def ready() -> Any:
            p = core.read_namespaced_pod(name, "code-hosting")
            return p if any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or []) else None

        live = wait_for(f"pod {name} Ready", ready, timeout=120)
        (sidecar,) = live.spec.init_containers
        for probe in (sidecar.startup_probe, sidecar.readiness_probe, sidecar.liveness_probe):
            assert probe._exec is None and probe.http_get.port == 8788, probe
        base = f"http://{live.status.pod_ip}:8788"
        with urllib.request.urlopen(f"{base}/readyz", timeout=5) as r:
            assert r.status == 200
        for path, data in (("/call/github.create_comment", b"{}"), ("/metrics", None), (f"/calls/{name}/restart-1", None)):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(base + path, data=data), timeout=5)
            assert refused.value.code == 404, path
        logs = wait_for("the first call", lambda: "FIRST" in (out := kubectl(
            kc, "-n", "code-hosting", "logs", name, "-c", "agent", check=False)) and out, timeout=60)
        assert "FIRST 200" in logs, logs
        # the gateway's PID 1 ends (SIGTERM; SIGKILL from inside its own PID namespace is ignored)
        kubectl(kc, "-n", "code-hosting", "exec", name, "-c", CONTAINER, "--",
                "python", "-c", "import os, signal; os.kill(1, signal.SIGTERM)")
        kubectl(kc, "-n", "code-hosting", "exec", name, "-c", "agent", "--", "touch", "/tmp/again")
        restarted = wait_for("the gateway restarted and Ready again", lambda: (
            (s := core.read_namespaced_pod(name, "code-hosting")).status.init_container_statuses[0].restart_count >= 1
            and ready() and s), timeout=120)
        assert restarted.status.init_container_statuses[0].restart_count == 1
        logs = wait_for("the retry", lambda: "AGAIN" in (out := kubectl(
            kc, "-n", "code-hosting", "logs", name, "-c", "agent", check=False)) and out, timeout=90)
        # the repeat under the same key is the entry already made: 409 duplicate, nothing run again
        assert "AGAIN 409" in logs, logs
        made = [r for r in upstream_requests() if r.get("route") == "comments.create"
                and r["arguments"].get("client_id") == name]
        ledger = json.loads(kubectl(kc, "-n", "code-hosting", "get", "ledger", name, "-o", "json"))
        entries = ledger["status"]["entries"]
        # the repeat is recorded as a refusal of its own (a ULID), the call itself once
        assert [(e["id"], e["state"]) for e in entries if e["state"] != "refused"] == [("restart-1", "succeeded")]
        assert [e["error"]["code"] for e in entries if e["state"] == "refused"] == ["duplicate"], entries
        assert len(made) == 1, made
    finally:
        core.delete_namespaced_pod(name, "code-hosting", grace_period_seconds=0)
