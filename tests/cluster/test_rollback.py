"""Rollback in the cluster: `kubectl unwind plan|rollback ledger/NAME`, the operator's undo
Jobs run by the kubelet stand-in as local `unwind undo-step` processes, against the real
test upstream (tests/upstream/server.py)."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import random
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import GROUP, ROOT, VERSION, apply, trust, wait_for
from kubernetes import client

from benchmarks.rollback_world import (
    Upstream,
    create_ledger,
    effect,
    job_kubelet,
    make_entry,
    tool_resources,
)
from unwind.bundle import load_bundle
from unwind.cli.main import main
from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess, kubectl
from unwind.controlplane.node import Node, unwind_pod
from unwind.ledger.approvals import ApprovalRules
from unwind.ledger.clusterstore import compact_entry
from unwind.ledger.decide import record
from unwind.ledger.entry import Entry


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    up = Upstream(tmp_path_factory.mktemp("upstream") / "upstream.log")
    try:
        yield up
    finally:
        up.stop()


@pytest.fixture
def tools(operator: OperatorProcess, control_plane: ControlPlane, k8s_api: client.ApiClient,
          namespace: str, upstream: Upstream) -> dict[str, Any]:
    """The tools applied (by the trusted admin) and enforced: tool -> (manifest, checksum)."""
    upstream.admin("reset", {})
    resources = tool_resources(upstream.url)
    apply(control_plane.kubeconfig, namespace, *resources)

    def enforced() -> Any:
        cms = client.CoreV1Api(k8s_api).list_namespaced_config_map(namespace, label_selector="unwind.dev/bundle")
        loaded = load_bundle({c.metadata.name: dict(c.data or {}) for c in cms.items}, trust(k8s_api),
                             namespace=namespace)
        return loaded if len(loaded.manifests) == len(resources) else None
    bundle = wait_for("every tool enforced", enforced, timeout=60)
    return {t: (m, bundle.checksums[t]) for t, m in bundle.manifests.items()}


@pytest.fixture
def kubelet(k8s_api: client.ApiClient, namespace: str) -> Iterator[Node]:
    with job_kubelet(k8s_api, namespace) as k:
        yield k


class Ran:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


def plugin(kubeconfig: Path, namespace: str, *argv: str) -> Ran:
    """`kubectl unwind ...`: the CLI in this process, kubectl for every API call."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, f"--kubeconfig={kubeconfig}", "-n", namespace])
    return Ran(code, out.getvalue(), err.getvalue())


def ledger(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, namespace,
                                                                          "effectledgers", name))


def ledger_or_none(api: client.ApiClient, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return ledger(api, namespace, name)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or []}


def entries(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in obj["status"]["entries"]}


def jobs(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    return list(client.BatchV1Api(api).list_namespaced_job(namespace, label_selector=f"unwind.dev/ledger={name}").items)


def rolled_back(api: client.ApiClient, namespace: str, name: str, timeout: float = 120) -> dict[str, Any]:
    return dict(wait_for("RolledBack or Degraded", lambda: (o := ledger(api, namespace, name))
                         and (o.get("status") or {}).get("rollback", {}).get("finished") and o, timeout=timeout))


class Run:
    """Effects made at the upstream and the entries recording them."""

    def __init__(self, upstream: Upstream, tools: dict[str, Any]) -> None:
        self.upstream, self.tools, self.entries, self.answers = upstream, tools, [], {}
        self.start = datetime.now(UTC) - timedelta(minutes=10)

    def call(self, id_: str, tool: str, args: dict[str, Any], *, key: str | None = None,
             staged: bool = False, state: str = "succeeded", made: bool = True) -> Any:
        m, digest = self.tools[tool]
        sent = {**args, "draft": True} if staged else args
        answer = effect(self.upstream, tool, sent, key) if made else None
        self.answers[id_] = answer
        seq = len(self.entries) + 1
        self.entries.append(make_entry(m, digest, id_, seq, args, answer if state != "uncertain" else None,
                                       state=state, key=key, staged=staged,
                                       at=self.start + timedelta(seconds=seq)))
        return answer


def story(run: Run) -> None:
    run.call("pay-1", "stripe.create_charge", {"order_id": "o1", "amount": 2500, "card_token": "tok_visa"},
             key="charge-o1")
    run.call("c-1", "github.create_comment", {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "hi"})
    run.call("i-1", "github.create_issue", {"repo": "octo/hello", "title": "flaky test"})
    run.call("rel-1", "github.create_release", {"repo": "octo/hello", "tag": "v1.0.0", "name": "One"}, staged=True)


def effects(upstream: Upstream) -> dict[str, int]:
    return dict(upstream.admin("requests")["effects_by_route"])


def reads(upstream: Upstream) -> dict[str, int]:
    return dict(upstream.admin("requests")["by_route"])


def test_a_charge_a_comment_an_issue_and_a_staged_release_are_planned_and_rolled_back_by_jobs(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    run = Run(upstream, tools)
    story(run)
    create_ledger(k8s_api, namespace, "run-42", run.entries)
    kubeconfig = control_plane.kubeconfig

    plan = plugin(kubeconfig, namespace, "plan", "ledger/run-42", "--json")
    assert plan.code == 0, plan.err
    steps = json.loads(plan.out)["steps"]
    assert [(s["entry"], s["action"], s["undo_tool"]) for s in steps] == [
        ("rel-1", "discard", "github.delete_release"), ("i-1", "compensate", "github.close_issue"),
        ("c-1", "inverse", "github.delete_comment"), ("pay-1", "compensate", "stripe.refund")]
    assert steps[3]["residue"] == ["the charge still appears on the customer's statement"]
    assert steps[3]["arguments"] == {"charge_id": run.answers["pay-1"]["id"], "amount": 2500}
    text = plugin(kubeconfig, namespace, "plan", "ledger/run-42")
    assert "residue: the charge still appears on the customer's statement" in text.out

    before = effects(upstream)
    ran = plugin(kubeconfig, namespace, "rollback", "ledger/run-42", "--reason", "the agent misbehaved",
                 "--watch", "--timeout", "180s")
    assert ran.code == 0, ran.out + ran.err
    assert "step 4/4 pay-1 compensate stripe.refund: succeeded" in ran.out
    assert "ledger/run-42: rolled back" in ran.out

    obj = ledger(k8s_api, namespace, "run-42")
    assert conditions(obj)["RolledBack"]["status"] == "True"
    assert conditions(obj)["Degraded"]["status"] == "False"
    assert {e["state"] for e in entries(obj).values()} == {"undone"}
    assert obj["status"]["rollback"]["request"]["reason"] == "the agent misbehaved"
    after = effects(upstream)
    undos = {r: after.get(r, 0) - before.get(r, 0) for r in
             ("releases.delete", "issues.close", "comments.delete", "charges.refund")}
    assert undos == {"releases.delete": 1, "issues.close": 1, "comments.delete": 1, "charges.refund": 1}
    seen = reads(upstream)
    assert seen.get("issues.get", 0) >= 1 and seen.get("comments.get", 0) >= 1 and seen.get("charges.get", 0) >= 1
    made = jobs(k8s_api, namespace, "run-42")
    assert len(made) == 4
    assert all(j.spec.template.spec.automount_service_account_token is False for j in made)
    assert {j.metadata.labels["unwind.dev/entry"] for j in made} == {"pay-1", "c-1", "i-1", "rel-1"}
    reasons = [e.reason for e in client.CoreV1Api(k8s_api).list_namespaced_event(
        namespace, field_selector="involvedObject.name=run-42").items]
    assert reasons.count("StepSucceeded") == 4 and "RolledBack" in reasons

    # the evidence of the run holds the frozen plan and every step's outcome
    assert main(["keygen", str(tmp_path / "evidence")]) == 0
    exported = plugin(kubeconfig, namespace, "ledger", "export", "run-42", "--key",
                      str(tmp_path / "evidence.key"), "-o", str(tmp_path / "run-42.json"))
    assert exported.code == 0, exported.err
    evidence = json.loads((tmp_path / "run-42.json").read_text())["evidence"]
    [request] = evidence["rollbacks"]  # every request (one here), the one run with its frozen plan
    assert request["plan"] == obj["status"]["rollback"]
    assert request["request"]["reason"] == "the agent misbehaved" and request["result"] == "RolledBack"
    assert {s["entry"]: s["outcome"] for s in evidence["steps"]} == dict.fromkeys(
        ("pay-1", "c-1", "i-1", "rel-1"), "undone")
    assert main(["ledger", "verify", str(tmp_path / "run-42.json"), "--trust", str(tmp_path / "evidence.pub")]) == 0


def demo_objects(namespace: str) -> list[dict[str, Any]]:
    """examples/demo-agent.yaml in ``namespace``, with a charge first: the issue's story (the
    example's namespace has no payments tools)."""
    docs = [d for d in yaml.safe_load_all((ROOT / "examples" / "demo-agent.yaml").read_text()) if d]
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects", []):
            subject["namespace"] = namespace
    account, pod = docs[0], docs[-1]
    account["metadata"]["annotations"]["unwind.dev/scopes"] += ",payments:write"
    env = pod["spec"]["containers"][0]["env"][0]
    env["value"] = json.dumps([{"tool": "stripe.create_charge", "key": "charge-1", "arguments": {
        "order_id": "o1", "amount": 2500, "card_token": "tok_visa"}}, *json.loads(env["value"])])
    return docs


def approved_agent_run(api: client.ApiClient, kubeconfigs: list[Path], namespace: str, pod: str, entry: str,
                       logs: Path, reasons: tuple[str | None, ...] = ("ok", "ok")) -> str:
    """Approve ``entry`` (a charge: two finance users, each with its reason or none) once
    the agent waits for it, then wait for the agent's pod to end; what the agent said."""
    core = client.CoreV1Api(api)
    wait_for(f"{entry} awaiting approval", lambda: any(
        e["id"] == entry and e["state"] == "awaiting_approval"
        for e in ((ledger_or_none(api, namespace, pod) or {}).get("status") or {}).get("entries", [])),
        timeout=90)
    for kubeconfig, reason in zip(kubeconfigs, reasons, strict=True):
        approved = plugin(kubeconfig, namespace, "approve", f"ledger/{pod}", "--entry", entry,
                          *(("--reason", reason) if reason else ()))
        assert approved.code == 0, approved.err
    phase = wait_for(f"pod {pod} finished", lambda: (p := core.read_namespaced_pod(pod, namespace).status.phase)
                     in ("Succeeded", "Failed") and p, timeout=120)
    said = (logs / namespace / pod / "agent.log").read_text()
    assert phase == "Succeeded", said + (logs / namespace / pod / "unwind-gateway.log").read_text()
    return said


def test_the_demo_agent_calls_through_its_injected_gateway_and_its_run_is_rolled_back_by_jobs(
        tools: dict[str, Any], upstream: Upstream, control_plane: ControlPlane, k8s_api: client.ApiClient,
        namespace: str, tmp_path: Path) -> None:
    kubeconfig, logs = control_plane.kubeconfig, tmp_path / "pods"
    finance = [control_plane.user_kubeconfig(u) for u in ("carol", "dave")]
    with Node(k8s_api, namespace=namespace, select=unwind_pod, logs=logs,
              extra_env={"PYTHONPATH": str(ROOT / "operator")}):
        demo = demo_objects(namespace)
        apply(kubeconfig, namespace, *demo)
        # the charge needs two approvals of group finance; the agent repeats it until then.
        # dave gives no reason (issue 18: that decision used to wedge every rollback of the namespace)
        said = approved_agent_run(k8s_api, finance, namespace, "demo-run", "charge-1", logs, ("refund ok", None))
        assert "stripe.create_charge: 428 approval_required" in said
        assert "stripe.create_charge: 200 compensable, ledger demo-run entry charge-1; undo: compensate stripe.refund" in said
        assert "github.create_comment: 200 reversible, ledger demo-run entry comment-1; " \
               "undo: inverse github.delete_comment" in said
        assert "github.create_release: 200 irreversible" in said and "staged: discard github.delete_release" in said
        obj = ledger(k8s_api, namespace, "demo-run")
        assert [(e["id"], e["tool"]) for e in obj["status"]["entries"]] == [
            ("charge-1", "stripe.create_charge"), ("comment-1", "github.create_comment"),
            ("issue-1", "github.create_issue"), ("release-1", "github.create_release")]
        assert all(e["actor"] == f"system:serviceaccount:{namespace}:demo-agent" for e in obj["status"]["entries"])

        plan = plugin(kubeconfig, namespace, "plan", "ledger/demo-run", "--json")
        assert plan.code == 0, plan.err
        steps = json.loads(plan.out)["steps"]
        assert [(s["tool"], s["action"], s["undo_tool"]) for s in steps] == [
            ("github.create_release", "discard", "github.delete_release"),
            ("github.create_issue", "compensate", "github.close_issue"),
            ("github.create_comment", "inverse", "github.delete_comment"),
            ("stripe.create_charge", "compensate", "stripe.refund")]
        assert steps[1]["residue"] and steps[3]["residue"]

        before = effects(upstream)
        # bob edits in this namespace (the chart's unwind-edit): he may ask, and is recorded as asking
        ran = plugin(control_plane.user_kubeconfig("bob"), namespace, "rollback", "ledger/demo-run",
                     "--reason", "demo", "--watch", "--timeout", "180s")
        assert ran.code == 0, ran.out + ran.err
        assert "ledger/demo-run: rolled back" in ran.out
        obj = ledger(k8s_api, namespace, "demo-run")
        after = effects(upstream)

        # the undone charge no longer holds its (global) idempotency key: another run charges
        # the same order, where before the rollback it would have been a 409 duplicate; the
        # upstream remembers the key too (as Stripe does) and answers with the first charge
        asked = reads(upstream).get("charges.create", 0)
        again = copy.deepcopy(demo[-1])
        again["metadata"]["name"] = "demo-run-2"
        calls = json.loads(again["spec"]["containers"][0]["env"][0]["value"])
        again["spec"]["containers"][0]["env"][0]["value"] = json.dumps([{**calls[0], "key": "charge-2"}])
        apply(kubeconfig, namespace, again)
        said = approved_agent_run(k8s_api, finance, namespace, "demo-run-2", "charge-2", logs)
        assert "stripe.create_charge: 200 compensable, ledger demo-run-2 entry charge-2" in said
    assert conditions(obj)["RolledBack"]["status"] == "True"
    assert {e["state"] for e in obj["status"]["entries"]} == {"undone"}
    charge = next(e for e in obj["status"]["entries"] if e["id"] == "charge-1")
    assert {d["user"]: d.get("reason") for d in charge["approval"]["decisions"]} == {"carol": "refund ok", "dave": None}
    assert obj["status"]["rollback"]["requestedBy"]["user"] == "bob"
    assert obj["metadata"]["annotations"]["unwind.dev/rollback-by"] == "bob"
    wide = kubectl(control_plane.kubeconfig, "-n", namespace, "get", "ledger", "demo-run", "-o", "wide").split("\n")
    assert "REQUESTED BY" in wide[0] and wide[1].split()[-2] == "bob"  # the column before AGE
    assert {r: after.get(r, 0) - before.get(r, 0) for r in
            ("releases.delete", "issues.close", "comments.delete", "charges.refund")} == dict.fromkeys(
        ("releases.delete", "issues.close", "comments.delete", "charges.refund"), 1)
    assert reads(upstream)["charges.create"] == asked + 1  # the gateway let it through
    assert effects(upstream)["charges.create"] == after["charges.create"]  # the upstream deduplicated it


def test_a_failed_read_back_fails_its_step_with_the_first_mismatch_and_the_ledger_is_degraded(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str) -> None:
    run = Run(upstream, tools)
    run.call("w-1", "test.issue_checked_wrongly", {"repo": "octo/hello", "title": "x"})
    run.call("c-1", "github.create_comment", {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "hi"})
    create_ledger(k8s_api, namespace, "run-bad", run.entries)
    ran = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/run-bad", "--reason", "test",
                 "--watch", "--timeout", "180s")
    assert ran.code == 1, ran.out + ran.err
    obj = ledger(k8s_api, namespace, "run-bad")
    degraded = conditions(obj)["Degraded"]
    assert degraded["status"] == "True"
    assert 'step 2 (w-1 compensate github.close_issue): state is "closed", expected "completed"' in degraded["message"]
    failed = obj["status"]["rollback"]["steps"][1]
    assert failed["state"] == "failed" and failed["first_mismatch"] == 'state is "closed", expected "completed"'
    assert entries(obj)["w-1"]["state"] == "undo_failed"
    assert entries(obj)["c-1"]["state"] == "undone"  # the newer comment ran first


def test_a_run_whose_name_is_longer_than_a_label_value_is_rolled_back(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str) -> None:
    name = "agent-" + "long" * 50 + ".run-1"  # 212 characters: a valid name, too long for a label
    run = Run(upstream, tools)
    run.call("c-1", "github.create_comment", {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "hi"})
    create_ledger(k8s_api, namespace, name, run.entries)
    ran = plugin(control_plane.kubeconfig, namespace, "rollback", f"ledger/{name}", "--reason", "test",
                 "--watch", "--timeout", "120s")
    assert ran.code == 0, ran.out + ran.err
    assert entries(ledger(k8s_api, namespace, name))["c-1"]["state"] == "undone"


def test_an_unrecoverable_entry_is_reported_and_skipped_and_since_undoes_only_what_came_after(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str) -> None:
    run = Run(upstream, tools)
    old = run.call("i-old", "github.create_issue", {"repo": "octo/hello", "title": "before"})
    run.call("c-1", "github.create_comment", {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "hi"})
    run.call("x-1", "test.issue_without_number", {"repo": "octo/hello", "title": "no number"})
    new = run.call("i-new", "github.create_issue", {"repo": "octo/hello", "title": "after"})
    create_ledger(k8s_api, namespace, "run-since", run.entries)
    plan = plugin(control_plane.kubeconfig, namespace, "plan", "ledger/run-since", "--since", "c-1", "--json")
    assert [(s["entry"], s["action"]) for s in json.loads(plan.out)["steps"]] == [
        ("i-new", "compensate"), ("x-1", "unrecoverable")]
    ran = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/run-since", "--since", "c-1",
                 "--reason", "after the checkpoint", "--watch", "--timeout", "120s")
    assert ran.code == 0, ran.out + ran.err
    obj = ledger(k8s_api, namespace, "run-since")
    assert "x-1 (unrecoverable)" in conditions(obj)["RolledBack"]["message"]
    states = {k: e["state"] for k, e in entries(obj).items()}
    assert states == {"i-old": "succeeded", "c-1": "succeeded", "x-1": "succeeded", "i-new": "undone"}
    assert upstream.request("GET", f"/issues/{new['number']}")["state"] == "closed"
    assert upstream.request("GET", f"/issues/{old['number']}")["state"] == "open"


def test_a_lost_answer_is_found_by_its_lookup_and_rolled_back_like_any_other(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str) -> None:
    run = Run(upstream, tools)
    # the upstream applied the charge, the gateway saw a timeout: the entry is uncertain
    charge = effect(upstream, "stripe.create_charge", {"order_id": "o9", "amount": 700}, "charge-o9")
    run.call("pay-9", "stripe.create_charge", {"order_id": "o9", "amount": 700}, key="charge-o9",
             state="uncertain", made=False)
    create_ledger(k8s_api, namespace, "run-lost", run.entries)
    ran = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/run-lost", "--reason", "lost",
                 "--watch", "--timeout", "120s")
    assert ran.code == 0, ran.out + ran.err
    obj = ledger(k8s_api, namespace, "run-lost")
    steps = [(s["action"], s["state"], s.get("outcome")) for s in obj["status"]["rollback"]["steps"]]
    assert steps == [("lookup", "succeeded", "found"), ("compensate", "succeeded", "undone")]
    entry = entries(obj)["pay-9"]
    assert entry["state"] == "undone" and entry["handle"]["result"]["id"] == charge["id"]
    assert upstream.request("GET", f"/charges?charge_id={charge['id']}")["refunded"] is True


def test_an_uncertain_entry_is_resolved_by_a_lookup_job_without_a_rollback(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, k8s_api: client.ApiClient,
        namespace: str) -> None:
    run = Run(upstream, tools)
    charge = effect(upstream, "stripe.create_charge", {"order_id": "o5", "amount": 5}, "charge-o5")
    run.call("pay-5", "stripe.create_charge", {"order_id": "o5", "amount": 5}, key="charge-o5",
             state="uncertain", made=False)
    run.call("pay-6", "stripe.create_charge", {"order_id": "o6", "amount": 6}, key="charge-o6",
             state="uncertain", made=False)  # never reached the upstream
    create_ledger(k8s_api, namespace, "run-timer", run.entries)
    obj = wait_for("both resolved", lambda: (o := ledger(k8s_api, namespace, "run-timer"))
                   and {e["state"] for e in entries(o).values()} == {"succeeded", "failed"} and o, timeout=90)
    found, gone = entries(obj)["pay-5"], entries(obj)["pay-6"]
    assert found["state"] == "succeeded" and found["handle"]["result"]["id"] == charge["id"]
    assert gone["state"] == "failed" and gone["error"]["code"] == "not_found"
    assert "rollback" not in obj["status"]


def test_the_operator_killed_ten_times_during_a_rollback_of_twenty_entries_undoes_each_exactly_once(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        operator: OperatorProcess, k8s_api: client.ApiClient, namespace: str) -> None:
    run = Run(upstream, tools)
    for i in range(20):
        if i % 2:
            run.call(f"c-{i}", "github.create_comment", {"repo": "octo/hello", "issue": i, "client_id": f"c{i}", "body": "x"})
        else:
            run.call(f"i-{i}", "github.create_issue", {"repo": "octo/hello", "title": f"issue {i}"})
    create_ledger(k8s_api, namespace, "run-chaos", run.entries)
    before = effects(upstream)
    ran = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/run-chaos", "--reason", "chaos")
    assert ran.code == 0, ran.err
    rng = random.Random(11)

    def finished() -> bool:
        rb = (ledger(k8s_api, namespace, "run-chaos").get("status") or {}).get("rollback") or {}
        return bool(rb.get("finished"))
    kills = 0
    try:
        while kills < 10 and not finished():
            # a random moment: before the restarted operator leads (after --lease-duration=6),
            # or while it records and starts steps
            time.sleep(rng.uniform(0.5, 8.0))
            operator.stop(sig=9)
            kills += 1
            operator.start()
    finally:
        if operator.proc is None or operator.proc.poll() is not None:
            operator.start()
    assert kills == 10, f"the rollback finished after {kills} kills"
    obj = rolled_back(k8s_api, namespace, "run-chaos", timeout=240)
    assert conditions(obj)["RolledBack"]["status"] == "True", conditions(obj)
    assert {e["state"] for e in entries(obj).values()} == {"undone"}
    after = effects(upstream)
    assert after.get("issues.close", 0) - before.get("issues.close", 0) == 10
    assert after.get("comments.delete", 0) - before.get("comments.delete", 0) == 10
    assert len(jobs(k8s_api, namespace, "run-chaos")) == 20


def test_a_step_whose_undo_requires_approval_waits_for_an_approval_of_its_entry(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str) -> None:
    run = Run(upstream, tools)
    issue = run.call("i-1", "test.issue_closed_with_approval", {"repo": "octo/hello", "title": "needs a human"})
    create_ledger(k8s_api, namespace, "run-approve", run.entries)
    ran = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/run-approve", "--reason", "r")
    assert ran.code == 0, ran.err
    waiting = wait_for("waiting for approval", lambda: (o := ledger(k8s_api, namespace, "run-approve"))
                       and conditions(o).get("RolledBack", {}).get("reason") == "WaitingForApproval" and o)
    assert "kubectl unwind approve ledger/run-approve --entry i-1" in conditions(waiting)["RolledBack"]["message"]
    assert not jobs(k8s_api, namespace, "run-approve")
    approved = plugin(control_plane.user_kubeconfig("carol"), namespace, "approve", "ledger/run-approve",
                      "--entry", "i-1")
    assert approved.code == 0, approved.err
    obj = rolled_back(k8s_api, namespace, "run-approve")
    assert conditions(obj)["RolledBack"]["status"] == "True"
    step = obj["status"]["rollback"]["steps"][0]
    assert step["approved_by"]["user"] == "carol"
    assert entries(obj)["i-1"]["undo"]["approved_by"]["user"] == "carol"
    assert upstream.request("GET", f"/issues/{issue['number']}")["state"] == "closed"


# ---- issue 18: a decision without a reason, one ledger's failure, a partial rollback -------

FINANCE = ApprovalRules(roles=("finance",), quorum=2, timeout_ms=None, on_timeout="deny", escalate_to=())


def write_entries(api: client.ApiClient, namespace: str, name: str, entries: list[dict[str, Any]]) -> None:
    """Replace the ledger's entries as the gateway writes them (conditional on what was read)."""
    custom: Any = client.CustomObjectsApi(api)
    obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "effectledgers", name)
    obj["status"] = {**obj.get("status", {}), "entries": entries, "entryCount": len(entries),
                     "lastState": entries[-1]["state"]}
    custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, "effectledgers", name, obj)


def test_a_charge_approved_by_two_finance_users_one_without_a_reason_is_rolled_back_and_refunded(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str) -> None:
    m, digest = tools["stripe.create_charge"]
    args = {"order_id": "o8", "amount": 1200, "card_token": "tok_visa"}
    waiting = make_entry(m, digest, "charge-1", 1, args, None, state="awaiting_approval", key="charge-o8")
    waiting = waiting.model_copy(update={"handle": None, "approval": record(FINANCE, "kubernetes")})
    create_ledger(k8s_api, namespace, "checkout-8", [])
    write_entries(k8s_api, namespace, "checkout-8", [compact_entry(waiting.to_json())])  # as the gateway writes it
    for user, reason in (("carol", ("--reason", "the customer asked")), ("dave", ())):
        approved = plugin(control_plane.user_kubeconfig(user), namespace, "approve", "ledger/checkout-8",
                          "--entry", "charge-1", *reason)
        assert approved.code == 0, approved.err
    decided = wait_for("approved by two finance users", lambda: (e := entries(ledger(k8s_api, namespace, "checkout-8"))
                                                                 ["charge-1"]) and e["approval"]["state"] == "approved" and e)
    # by user: two Approvals made in one second are read back in either order
    assert {d["user"]: d.get("reason") for d in decided["approval"]["decisions"]} == {
        "carol": "the customer asked", "dave": None}
    # the agent repeats the call: the gateway runs it and records the answer, decisions kept
    charge = effect(upstream, "stripe.create_charge", args, "charge-o8")
    ran = make_entry(m, digest, "charge-1", 1, args, charge, key="charge-o8")
    ran = ran.model_copy(update={"approval": Entry.model_validate(decided).approval})
    write_entries(k8s_api, namespace, "checkout-8", [compact_entry(ran.to_json())])

    rolled = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/checkout-8", "--reason",
                    "charged twice", "--watch", "--timeout", "120s")
    assert rolled.code == 0, rolled.out + rolled.err
    assert "ledger/checkout-8: rolled back" in rolled.out
    obj = ledger(k8s_api, namespace, "checkout-8")
    assert conditions(obj)["RolledBack"]["status"] == "True" and obj["status"]["live"] == 0
    assert entries(obj)["charge-1"]["state"] == "undone"
    # the reason-less decision stays reason-less through the rollback (decisions in either order)
    kept = {d["user"]: d for d in entries(obj)["charge-1"]["approval"]["decisions"]}
    assert "reason" not in kept["dave"] and kept["carol"]["reason"] == "the customer asked"
    assert upstream.request("GET", f"/charges?charge_id={charge['id']}")["refunded"] is True


class Refuser:
    """A validating webhook refusing (422) each status update that carries a rollback, of the
    EffectLedgers labelled ``test.unwind.dev/refuse``: a ledger whose plan the API server will
    not store, as it refused the reason-less decision of issue 18."""

    LABEL = "test.unwind.dev/refuse"

    def __init__(self, api: client.ApiClient, work: Path) -> None:
        import base64
        import datetime as dt
        import http.server
        import ssl
        import threading

        from unwind.operator.certs import issue, new_ca

        now = dt.datetime.now(dt.UTC)
        ca, ca_key = new_ca(now, dt.timedelta(hours=1))
        cert, key = issue(ca, ca_key, ["127.0.0.1"], now, dt.timedelta(hours=1))
        (work / "tls.crt").write_text(cert)
        (work / "tls.key").write_text(key)

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                request = review["request"]
                refuse = "rollback" in ((request.get("object") or {}).get("status") or {})
                answer: dict[str, Any] = {"uid": request["uid"], "allowed": not refuse}
                if refuse:
                    answer["status"] = {"code": 422, "message": "status.entries.approval.decisions.reason: "
                                                                'Invalid value: "null" (the test refuses it)'}
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": answer}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(work / "tls.crt", work / "tls.key")
        self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.api, self.name = client.AdmissionregistrationV1Api(api), f"test-refuse-{uuid.uuid4().hex[:10]}"
        self.api.create_validating_webhook_configuration({
            "metadata": {"name": self.name},
            "webhooks": [{"name": "refuse.test.unwind.dev", "admissionReviewVersions": ["v1"],
                          "sideEffects": "None", "failurePolicy": "Ignore", "timeoutSeconds": 5,
                          "clientConfig": {"url": f"https://127.0.0.1:{self.server.server_address[1]}/",
                                           "caBundle": base64.b64encode(ca.encode()).decode()},
                          "objectSelector": {"matchLabels": {self.LABEL: "status"}},
                          "rules": [{"apiGroups": [GROUP], "apiVersions": [VERSION], "operations": ["UPDATE"],
                                     "resources": ["effectledgers/status"], "scope": "Namespaced"}]}]})

    def label(self, api: client.ApiClient, namespace: str, name: str) -> None:
        client.CustomObjectsApi(api).patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "effectledgers", name, {"metadata": {"labels": {self.LABEL: "status"}}})

    def ready(self, api: client.ApiClient, namespace: str) -> None:
        """Wait until the API server calls the webhook: a probe ledger's rollback is refused."""
        create_ledger(api, namespace, "probe", [])
        self.label(api, namespace, "probe")

        def refused() -> bool:
            custom: Any = client.CustomObjectsApi(api)
            obj = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "effectledgers", "probe")
            obj["status"]["rollback"] = {"request": {"requested": False}, "generation": 1, "planned": "2026-01-01T00:00:00Z"}
            try:
                custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, "effectledgers", "probe", obj)
            except client.ApiException as exc:
                return exc.status == 422
            return False
        wait_for("the refusing webhook called", refused)

    def stop(self) -> None:
        with contextlib.suppress(client.ApiException):
            self.api.delete_validating_webhook_configuration(self.name)
        self.server.shutdown()


@pytest.fixture
def refuser(k8s_api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[Refuser]:
    r = Refuser(k8s_api, tmp_path)
    try:
        r.ready(k8s_api, namespace)
        yield r
    finally:
        r.stop()


def events_of(api: client.ApiClient, namespace: str, name: str) -> list[Any]:
    return list(client.CoreV1Api(api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items)


def test_a_ledger_whose_status_the_api_server_refuses_never_holds_up_another_rollback_in_its_namespace(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str, refuser: Refuser) -> None:
    charges = {}
    for name in ("checkout-8", "checkout-9"):
        run = Run(upstream, tools)
        charges[name] = run.call("pay-1", "stripe.create_charge", {"order_id": name, "amount": 900}, key=f"charge-{name}")
        create_ledger(k8s_api, namespace, name, run.entries)
    refuser.label(k8s_api, namespace, "checkout-8")

    broken = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/checkout-8", "--reason", "refund",
                    "--watch", "--timeout", "90s")
    assert broken.code == 1, broken.out + broken.err
    assert "ledger/checkout-8: not rolled back: StatusWriteFailed: the API server refused this ledger's status "            "(422" in broken.out, broken.out + broken.err
    assert "is the operator running" not in broken.out + broken.err
    # the other ledger of the namespace is rolled back while that one keeps failing
    fine = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/checkout-9", "--reason", "refund",
                  "--watch", "--timeout", "120s")
    assert fine.code == 0, fine.out + fine.err
    assert upstream.request("GET", f"/charges?charge_id={charges['checkout-9']['id']}")["refunded"] is True
    obj = ledger(k8s_api, namespace, "checkout-8")
    assert (conditions(obj)["Degraded"]["status"], conditions(obj)["Degraded"]["reason"]) == ("True", "StatusWriteFailed")
    assert conditions(obj)["RolledBack"]["reason"] == "StatusWriteFailed"
    assert "the test refuses it" in conditions(obj)["Degraded"]["message"]
    assert [e.reason for e in events_of(k8s_api, namespace, "checkout-8")].count("StatusWriteFailed") == 1
    assert upstream.request("GET", f"/charges?charge_id={charges['checkout-8']['id']}")["refunded"] is False

    refuser.stop()  # the cause goes away: the ledger's own retry (or the timer) rolls it back
    done = wait_for("checkout-8 rolled back", lambda: (o := ledger(k8s_api, namespace, "checkout-8"))
                    and conditions(o).get("RolledBack", {}).get("status") == "True" and o, timeout=180)
    assert conditions(done)["Degraded"]["status"] == "False"
    assert upstream.request("GET", f"/charges?charge_id={charges['checkout-8']['id']}")["refunded"] is True


def test_a_rollback_of_one_entry_reads_partially_rolled_back_and_get_ledger_shows_what_is_live(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str) -> None:
    run = Run(upstream, tools)
    run.call("pay-1", "stripe.create_charge", {"order_id": "o7", "amount": 300}, key="charge-o7")
    run.call("c-1", "github.create_comment", {"repo": "octo/hello", "issue": 7, "client_id": "c7", "body": "hi"})
    run.call("r-1", "github.get_issue", {"repo": "octo/hello", "issue": 7}, made=False)  # read only: never live
    create_ledger(k8s_api, namespace, "run-part", run.entries)
    ran = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/run-part", "--entry", "c-1",
                 "--reason", "only the comment", "--watch", "--timeout", "120s")
    assert ran.code == 0, ran.out + ran.err
    assert "ledger/run-part: partly rolled back: 1 step ran; 1 other entry of the run still has live effects "            "(pay-1)" in ran.out
    obj = ledger(k8s_api, namespace, "run-part")
    rolled = conditions(obj)["RolledBack"]
    assert (rolled["status"], rolled["reason"]) == ("False", "PartiallyRolledBack")
    header, row = kubectl(control_plane.kubeconfig, "-n", namespace, "get", "ledger", "run-part").split("\n")[:2]
    assert row[header.index(" LIVE ") + 1:].split()[0] == "1"  # the column, between LAST STATE and AGE
    assert kubectl(control_plane.kubeconfig, "-n", namespace, "get", "ledger", "run-part",
                   "-o", "jsonpath={.status.live}") == "1"

    rest = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/run-part", "--reason", "the rest",
                  "--watch", "--timeout", "120s")
    assert rest.code == 0, rest.out + rest.err
    assert "ledger/run-part: rolled back" in rest.out
    assert kubectl(control_plane.kubeconfig, "-n", namespace, "get", "ledger", "run-part",
                   "-o", "jsonpath={.status.live}") == "0"


def test_a_step_that_can_never_succeed_is_settled_by_a_person_and_the_settle_is_in_the_evidence(
        tools: dict[str, Any], upstream: Upstream, kubelet: Node, control_plane: ControlPlane,
        k8s_api: client.ApiClient, namespace: str, tmp_path: Path) -> None:
    run = Run(upstream, tools)
    run.call("i-1", "test.issue_checked_wrongly", {"repo": "octo/hello", "title": "never completed"})
    run.call("c-1", "github.create_comment", {"repo": "octo/hello", "issue": 7, "client_id": "c-s", "body": "hi"})
    create_ledger(k8s_api, namespace, "run-settle", run.entries)
    failed = plugin(control_plane.kubeconfig, namespace, "rollback", "ledger/run-settle", "--reason",
                    "the agent went rogue", "--watch", "--timeout", "120s")
    assert failed.code == 1, failed.out + failed.err
    obj = ledger(k8s_api, namespace, "run-settle")
    assert conditions(obj)["Degraded"]["status"] == "True" and obj["status"]["live"] == 1
    assert entries(obj)["i-1"]["state"] == "undo_failed" and entries(obj)["c-1"]["state"] == "undone"

    carol = control_plane.user_kubeconfig("carol")
    settled = plugin(carol, namespace, "settle", "ledger/run-settle", "i-1", "--reason",
                     "closed by hand in the tracker")
    assert settled.code == 0, settled.out + settled.err
    assert "carol" in settled.out, settled.out
    obj = wait_for("the settle in the entry", lambda: (o := ledger(k8s_api, namespace, "run-settle"))
                   and entries(o)["i-1"]["state"] == "settled" and o)
    made = entries(obj)["i-1"]["settled"]
    assert (made["by"], made["identities"], made["reason"], made["was"]) == (
        "carol", "kubernetes", "closed by hand in the tracker", "undo_failed")
    # the ledger agrees with the world: nothing of the run is live, no failure stands
    obj = wait_for("LIVE 0 and not degraded", lambda: (o := ledger(k8s_api, namespace, "run-settle"))
                   and o["status"].get("live") == 0 and conditions(o)["Degraded"]["status"] == "False" and o)
    assert conditions(obj)["RolledBack"]["status"] == "True", conditions(obj)

    assert main(["keygen", str(tmp_path / "evidence")]) == 0
    exported = plugin(control_plane.kubeconfig, namespace, "ledger", "export", "run-settle", "--key",
                      str(tmp_path / "evidence.key"), "-o", str(tmp_path / "run-settle.json"))
    assert exported.code == 0, exported.err
    evidence = json.loads((tmp_path / "run-settle.json").read_text())["evidence"]
    [settle] = evidence["settles"]
    assert (settle["entry"], settle["by"], settle["reason"]) == ("i-1", "carol", "closed by hand in the tracker")
    # the request kept beside the settle; its step reads settled, as the ledger's conditions do
    [request] = evidence["rollbacks"]
    assert request["request"]["reason"] == "the agent went rogue" and request["result"] == "RolledBack"
    assert {s["entry"]: s["state"] for s in request["steps"]} == {"c-1": "succeeded", "i-1": "settled"}
    assert main(["ledger", "verify", str(tmp_path / "run-settle.json"), "--trust",
                 str(tmp_path / "evidence.pub")]) == 0
