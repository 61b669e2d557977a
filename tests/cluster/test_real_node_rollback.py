"""Rollbacks on a real node against a store nobody here wrote (issue 27's and 30.1's "done
when"): `unwind dev up` as in test_real_node.py, and pouchdb-server (npm; the CouchDB API,
documents with revisions, tests/rollback/pouchdb.py) on the node's bridge address, where pods
reach it. An agent pod with the injected gateway creates documents, edits them and edits one
that existed before; `kubectl unwind rollback --watch` has the operator (the chart's
Deployment, default parallelism) run the undos as Jobs in containers of the image. Every
check reads the store itself, never through Unwind.

- the run rolls back to exactly the store before it: the undos of one document ran one at a
  time, newest first, each at the revision the one before it left (Jobs on one document never
  overlap; Jobs on different documents did);
- a document changed by hand after the run is not overwritten (its undo is refused as
  diverged, the ledger Degraded); a person settles it with `kubectl unwind settle`, the rest
  is rolled back, and the signed evidence holds both requests and the settles;
- a gateway beside a long-lived agent is not killed while four undo Jobs run at once on this
  two-core node: no restart, no failed probe, and it answers the agent afterwards.

One node per machine: run under the machine's lock (`flock /tmp/unwind-node.lock`); this
module's cluster is stopped before another module starts one.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from cluster_helpers import wait_for
from kubernetes import client
from test_real_node import RESTRICTED, ROOT, api, dev, finished, kc, plugin  # noqa: F401 (fixtures)

from tests.rollback.pouchdb import AFTER_RUN, AGENT, BEFORE, PouchDB, manifests_for
from unwind.bundle import BUNDLE_NAME
from unwind.cli.main import main
from unwind.controlplane import kubenode
from unwind.controlplane.dev import Started, kubectl
from unwind.operator.inject import CONTAINER

NS = "records"
AGENT_ACCOUNT = "records-agent"
ENTRIES = ("create-a", "create-b", "create-c", "read-kept", "update-kept-1", "update-a-1", "update-kept-2",
           "update-b-1", "update-a-2")  # AGENT's calls, by Idempotency-Key


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def store(dev: Started, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PouchDB]:  # noqa: F811
    """pouchdb-server on the bridge's address (there once the node is up): pods reach it."""
    host = kubenode.NODE_ADDRESS
    pouch = PouchDB(host, free_port(host), tmp_path_factory.mktemp("pouchdb"))
    try:
        yield pouch
    finally:
        pouch.stop()


@pytest.fixture(scope="module")
def records(kc: Path, store: PouchDB) -> None:  # noqa: F811
    """The namespace (Pod Security restricted), the agent's account (no RoleBinding: its
    gateway trades the pod's token for unwind-gateway's) and the store's tools, applied by the
    dev cluster's admin (a trusted applier: published without an Approval)."""
    tools = [{"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
              "metadata": {"name": spec["tool"].replace("_", "-"), "namespace": NS}, "spec": spec}
             for spec in yaml.safe_load(manifests_for(store.url))]
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump_all([
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS, "labels": {
            "pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/warn": "restricted"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {
            "name": AGENT_ACCOUNT, "namespace": NS, "annotations": {"unwind.dev/scopes": "docs:read,docs:write"}}},
        *tools]))
    kubectl(kc, "-n", NS, "wait", "--for=condition=Ready", "toolmanifests", "--all", "--timeout=120s")


def run_agent(kc: Path, api: client.ApiClient, store: PouchDB) -> str:  # noqa: F811
    """The store as before a run, then AGENT's run in a pod; the run's (the pod's) name."""
    store.reset(BEFORE)
    name = f"docs-{uuid.uuid4().hex[:6]}"
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": NS, "labels": {"unwind.dev/inject": "true"}},
           "spec": {"serviceAccountName": AGENT_ACCOUNT, "restartPolicy": "Never", "containers": [{
               "name": "agent", "image": "unwind:dev", "command": ["python", "-c", AGENT],
               "securityContext": dict(RESTRICTED)}]}}
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump(pod))
    phase = finished(api, NS, name, timeout=180)
    said = kubectl(kc, "-n", NS, "logs", name, "-c", "agent", check=False)
    assert phase == "Succeeded" and "DONE" in said, said + kubectl(kc, "-n", NS, "describe", "pod", name)
    assert store.titles() == AFTER_RUN
    return name


def ledger_of(kc: Path, name: str) -> dict[str, Any]:  # noqa: F811
    return dict(json.loads(kubectl(kc, "-n", NS, "get", "ledger", name, "-o", "json")))


def states(obj: dict[str, Any]) -> dict[str, str]:
    return {e["id"]: e["state"] for e in obj["status"]["entries"]}


def document(entry_id: str) -> str:
    """The document an entry of AGENT's run touched: create-a, update-a-2 -> a."""
    return entry_id.split("-")[1]


def test_a_run_that_creates_and_edits_documents_is_rolled_back_by_jobs_to_the_store_before_it(
        kc: Path, api: client.ApiClient, store: PouchDB, records: None) -> None:  # noqa: F811
    name = run_agent(kc, api, store)
    ran = plugin(kc, "rollback", f"ledger/{name}", "-n", NS, "--reason", "the agent misbehaved",
                 "--watch", "--timeout", "300s")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"ledger/{name}: rolled back: 8 steps ran" in ran.stdout, ran.stdout
    assert store.titles() == BEFORE  # read from the store: the new ones gone, kept's title back
    obj = ledger_of(kc, name)
    assert states(obj) == {e: "succeeded" if e == "read-kept" else "undone" for e in ENTRIES}
    assert obj["status"]["live"] == 0

    jobs = client.BatchV1Api(api).list_namespaced_job(NS, label_selector=f"unwind.dev/ledger={name}").items
    spans = {j.metadata.labels["unwind.dev/entry"]: (j.status.start_time, j.status.completion_time) for j in jobs}
    assert len(spans) == 8 and all(start and end for start, end in spans.values()), spans
    on_one = [(a, b) for a in spans for b in spans if a < b and document(a) == document(b)]
    for a, b in on_one:  # one at a time on one document: one ended before the other started
        (sa, ea), (sb, eb) = spans[a], spans[b]
        assert eb <= sa or ea <= sb, (a, spans[a], b, spans[b])
    overlapping = [(a, b) for a in spans for b in spans if a < b and document(a) != document(b)
                   and spans[a][0] < spans[b][1] and spans[b][0] < spans[a][1]]
    assert overlapping, spans  # and at once on different ones
    names = {j.metadata.name for j in jobs}
    pods = [p for p in client.CoreV1Api(api).list_namespaced_pod(NS, label_selector="job-name").items
            if p.metadata.labels["job-name"] in names]
    assert len(pods) >= 8 and all(p.status.container_statuses[0].container_id.startswith("containerd://")
                                  for p in pods)  # each undo ran in a container of the image


def test_a_document_changed_by_hand_is_kept_settled_by_a_person_and_the_settle_is_in_the_signed_evidence(
        kc: Path, api: client.ApiClient, store: PouchDB, records: None, tmp_path: Path) -> None:  # noqa: F811
    name = run_agent(kc, api, store)
    store.put("b", "fixed by hand")  # someone edits b after the agent did
    failed = plugin(kc, "rollback", f"ledger/{name}", "-n", NS, "--reason", "the agent misbehaved",
                    "--watch", "--timeout", "300s")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert f"ledger/{name}: not rolled back" in failed.stdout, failed.stdout
    assert 'update-b-1 inverse docs.restore: failed: title is "fixed by hand", the call left "final b"' \
        in failed.stdout, failed.stdout
    assert store.titles()["b"] == "fixed by hand"  # not overwritten
    obj = ledger_of(kc, name)
    assert states(obj)["update-b-1"] == "undo_failed"
    degraded = {c["type"]: c for c in obj["status"]["conditions"]}["Degraded"]
    assert degraded["status"] == "True" and "update-b-1" in degraded["message"]

    for entry in ("update-b-1", "create-b"):
        settled = plugin(kc, "settle", f"ledger/{name}", entry, "-n", NS, "--reason", "b keeps the hand edit")
        assert settled.returncode == 0, settled.stdout + settled.stderr
        assert settled.stdout.startswith(f"settled entry {entry} (docs.") and \
            f"of ledger/{name} as " in settled.stdout and ": b keeps the hand edit; LIVE " in settled.stdout
    rest = plugin(kc, "rollback", f"ledger/{name}", "-n", NS, "--reason", "the rest, b settled",
                  "--watch", "--timeout", "300s")
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert f"ledger/{name}: rolled back" in rest.stdout, rest.stdout
    assert store.titles() == {**BEFORE, "b": "fixed by hand"}
    obj = ledger_of(kc, name)
    assert states(obj)["update-b-1"] == states(obj)["create-b"] == "settled"
    assert obj["status"]["live"] == 0
    by = {e["id"]: e["settled"] for e in obj["status"]["entries"] if e.get("settled")}
    assert {e: (s["identities"], s["was"]) for e, s in by.items()} == {
        "update-b-1": ("kubernetes", "undo_failed"), "create-b": ("kubernetes", "succeeded")}
    listed = kubectl(kc, "get", "ledger", name, "-n", NS, "-o", 'jsonpath={range .status.entries[?(@.state=="settled")]}'
                     '{.id} {.settled.by} {.settled.reason}{"\\n"}{end}')  # the runbook's command
    assert sorted(listed.splitlines()) == [f"create-b {by['create-b']['by']} b keeps the hand edit",
                                           f"update-b-1 {by['update-b-1']['by']} b keeps the hand edit"]

    assert main(["keygen", str(tmp_path / "evidence")]) == 0
    exported = plugin(kc, "ledger", "export", name, "-n", NS, "--key", str(tmp_path / "evidence.key"),
                      "--file", str(tmp_path / "evidence.json"))
    assert exported.returncode == 0, exported.stdout + exported.stderr
    evidence = json.loads((tmp_path / "evidence.json").read_text())["evidence"]
    assert {s["entry"]: (s["by"], s["reason"]) for s in evidence["settles"]} == {
        e: (by[e]["by"], "b keeps the hand edit") for e in ("update-b-1", "create-b")}
    assert [r["request"]["reason"] for r in evidence["rollbacks"]] == ["the agent misbehaved", "the rest, b settled"]
    assert main(["ledger", "verify", str(tmp_path / "evidence.json"), "--trust", str(tmp_path / "evidence.pub")]) == 0


STORE_SECRET = "records-store"


def _with_remove_secret(store: PouchDB, on: bool) -> str:
    """docs.remove (the creates' undo) sending a header from the Secret records-store: its
    undo Jobs mount that Secret, as every undo of an upstream behind a credential does."""
    specs = yaml.safe_load(manifests_for(store.url))
    remove = next(s for s in specs if s["tool"] == "docs.remove")
    if on:
        remove["upstream"]["headers"] = {"X-Store-Token": {"secretKeyRef": {"name": STORE_SECRET, "key": "token"}}}
    return yaml.safe_dump({"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
                           "metadata": {"name": "docs.remove", "namespace": NS}, "spec": remove})


def bundle_names(api: client.ApiClient, secret: str) -> bool:  # noqa: F811
    """Whether the namespace's published bundle (root and shards) names ``secret``: the
    webhook mounts the Secrets of the bundle it reads when a pod is admitted, so a pod made
    before the operator republished after an edit still mounts a Secret the edit dropped."""
    maps = client.CoreV1Api(api).list_namespaced_config_map(NS).items
    return any(secret in json.dumps(m.data or {}) for m in maps if m.metadata.name.startswith(BUNDLE_NAME))


def test_an_undo_whose_secret_was_deleted_is_named_within_15s_and_runs_once_the_secret_is_back(
        kc: Path, api: client.ApiClient, store: PouchDB, records: None) -> None:  # noqa: F811
    secret = ["-n", NS, "create", "secret", "generic", STORE_SECRET, "--from-literal=token=t0ken"]
    kubectl(kc, *secret)
    kubectl(kc, "apply", "-f", "-", input_text=_with_remove_secret(store, True))
    kubectl(kc, "-n", NS, "wait", "--for=condition=Ready", "toolmanifest/docs.remove", "--timeout=120s")
    wait_for("the bundle to name the Secret", lambda: bundle_names(api, STORE_SECRET), timeout=60)
    try:
        name = run_agent(kc, api, store)
        kubectl(kc, "-n", NS, "delete", "secret", STORE_SECRET)  # someone deleted it mid-incident
        watch = subprocess.Popen([str(ROOT / ".venv" / "bin" / "kubectl-unwind"), "rollback", f"ledger/{name}",
                                  "-n", NS, "--reason", "the agent misbehaved", "--watch", "--timeout", "300s",
                                  f"--kubeconfig={kc}"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            deadline, rolled, seen = time.monotonic() + 180, {}, datetime.now(UTC)
            while time.monotonic() < deadline:
                obj = ledger_of(kc, name)
                rolled = {c["type"]: c for c in obj["status"].get("conditions") or []}.get("RolledBack") or {}
                seen = datetime.now(UTC)
                if rolled.get("reason") == "StepStuck":
                    break
                time.sleep(1)
            assert rolled.get("reason") == "StepStuck", rolled
            assert f"Secret '{STORE_SECRET}' not found" in rolled["message"] and "remove" in rolled["message"], rolled
            steps = [s for s in obj["status"]["rollback"]["steps"] if s.get("started")
                     and s["job"] in rolled["message"]]
            started = min(datetime.fromisoformat(s["started"]) for s in steps)
            # lastTransitionTime moves only when the status flips (False stays False): the bound is
            # from the step's own start stamp to the moment the ledger was read saying it
            said = seen
            assert (said - started).total_seconds() <= 15, (started, said)
            print(f"StepStuck named {(said - started).total_seconds():.1f}s after the step started")
            kubectl(kc, *secret)  # the runbook's fix: the step then starts by itself
            out, _ = watch.communicate(timeout=300)
        finally:
            if watch.poll() is None:
                watch.kill()
        assert watch.returncode == 0, out
        assert "stuck: step" in out and STORE_SECRET in out, out
        assert f"ledger/{name}: rolled back" in out, out
        assert store.titles() == BEFORE
    finally:
        kubectl(kc, "apply", "-f", "-", input_text=_with_remove_secret(store, False))
        # the later tests' pods would otherwise mount the Secret deleted next and never start
        wait_for("the bundle to drop the Secret", lambda: not bundle_names(api, STORE_SECRET), timeout=60)
        kubectl(kc, "-n", NS, "delete", "secret", STORE_SECRET, "--ignore-not-found")


# A long-lived agent (issue 27's 2): its calls, then it stays in its pod beside its gateway,
# asking /readyz every second, as an agent waiting for its next task does, through the rollback
# of what it did. Every answer it did not get is a DOWN line.
LOAD_DOCS = 12  # different documents: twelve steps, none waiting for another, four at a time
LOAD_AGENT = """
import json, sys, time, urllib.request
GW = "http://127.0.0.1:8787"
for _ in range(200):
    try:
        urllib.request.urlopen(GW + "/readyz", timeout=2)
        break
    except OSError:
        time.sleep(0.3)
for i in range(int(sys.argv[1])):
    req = urllib.request.Request(GW + "/call/docs.create", method="POST",
                                 data=json.dumps({"arguments": {"id": f"load-{i}", "title": f"load {i}"}}).encode(),
                                 headers={"Content-Type": "application/json", "Idempotency-Key": f"create-load-{i}"})
    urllib.request.urlopen(req, timeout=60).read()
print("CALLED", flush=True)
while True:
    try:
        urllib.request.urlopen(GW + "/readyz", timeout=10).read()
    except OSError as exc:
        print("DOWN", time.strftime("%H:%M:%S"), exc, flush=True)
    time.sleep(1)
"""
# After the rollback, through the same gateway: the rolled-back run refuses a new call (fenced),
# the agent's next run (another X-Unwind-Run) is served.
AFTER_ROLLBACK = """
import json, sys, urllib.error, urllib.request
def call(run, tool, key, **arguments):
    req = urllib.request.Request("http://127.0.0.1:8787/call/" + tool, method="POST",
                                 data=json.dumps({"arguments": arguments}).encode(),
                                 headers={"Content-Type": "application/json", "Idempotency-Key": key,
                                          "X-Unwind-Run": run})
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            print(answer.status, json.dumps(json.loads(answer.read())))
    except urllib.error.HTTPError as exc:
        print(exc.code, json.dumps(json.loads(exc.read())))
call(sys.argv[1], "docs.create", "create-late", id="late", title="late")
call(sys.argv[1] + "-next", "docs.get", "read-kept", id="kept")
"""


def most_at_once(spans: list[tuple[datetime, datetime]]) -> int:
    """The most spans holding one instant (each from its start, up to its end)."""
    return max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)


def test_a_gateway_beside_a_long_lived_agent_is_not_killed_while_four_undo_jobs_run_at_once(
        kc: Path, api: client.ApiClient, store: PouchDB, records: None) -> None:  # noqa: F811
    store.reset(BEFORE)
    core = client.CoreV1Api(api)
    name = f"steady-{uuid.uuid4().hex[:6]}"
    kubectl(kc, "apply", "-f", "-", input_text=yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"unwind.dev/inject": "true"}},
        "spec": {"serviceAccountName": AGENT_ACCOUNT, "restartPolicy": "Never", "containers": [{
            "name": "agent", "image": "unwind:dev", "command": ["python", "-c", LOAD_AGENT, str(LOAD_DOCS)],
            "securityContext": dict(RESTRICTED)}]}}))
    try:
        try:
            wait_for(f"{name}'s calls", lambda: "CALLED" in kubectl(kc, "-n", NS, "logs", name, "-c", "agent",
                                                                   check=False), timeout=180)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{kubectl(kc, '-n', NS, 'describe', 'pod', name, check=False)}") from None
        assert set(store.titles()) == set(BEFORE) | {f"load-{i}" for i in range(LOAD_DOCS)}
        rollback_began = datetime.now(UTC)
        ran = plugin(kc, "rollback", f"ledger/{name}", "-n", NS, "--reason", "the agent misbehaved",
                     "--watch", "--timeout", "300s")
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert f"ledger/{name}: rolled back: {LOAD_DOCS} steps ran" in ran.stdout, ran.stdout
        assert store.titles() == BEFORE
        jobs = client.BatchV1Api(api).list_namespaced_job(NS, label_selector=f"unwind.dev/ledger={name}").items
        spans = [(j.status.start_time, j.status.completion_time) for j in jobs]
        assert len(spans) == LOAD_DOCS and most_at_once(spans) >= 4, spans  # the load: four undo pods at once

        pod = core.read_namespaced_pod(name, NS)
        assert pod.status.phase == "Running", pod.status
        (gateway,) = [c for c in pod.status.init_container_statuses if c.name == CONTAINER]
        assert gateway.restart_count == 0 and gateway.ready and gateway.state.running, gateway
        events = core.list_namespaced_event(NS, field_selector=f"involvedObject.name={name}").items
        # no probe failed and nothing was killed; only the startup probe may have said 503 (the
        # bundle not loaded yet), once a second while the gateway started, before any call
        probes = [(e.reason, e.message, e.count, e.last_timestamp) for e in events
                  if e.reason in ("Unhealthy", "Killing", "BackOff", "ProbeWarning")]
        starting = [p for p in probes if p[0] == "Unhealthy" and p[1].startswith("Startup probe failed")]
        assert set(probes) == set(starting) and all(p[3] < rollback_began for p in starting), probes
        agent_log = kubectl(kc, "-n", NS, "logs", name, "-c", "agent")
        assert "DOWN" not in agent_log, agent_log  # the agent never missed its gateway

        after = kubectl(kc, "-n", NS, "exec", name, "-c", "agent", "--", "python", "-c", AFTER_ROLLBACK, name)
        fenced, served = after.splitlines()
        assert fenced.startswith("409 ") and json.loads(fenced[4:])["error"]["code"] == "rolled_back", after
        assert served.startswith("200 ") and json.loads(served[4:])["title"] == "original", after
        print(f"{len(spans)} undo Jobs, {most_at_once(spans)} at once, the rollback "
              f"{(max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds():.0f}s; "
              f"gateway restarts 0, probe events {probes}")
    finally:
        kubectl(kc, "-n", NS, "delete", "pod", name, "--wait=false", check=False)
