"""The operator on the real control plane, installed by the Helm chart and running under
the chart's ServiceAccount token, so a missing RBAC rule fails these tests."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from pathlib import Path

from cluster_helpers import (
    CANCEL,
    CREATE,
    GROUP,
    METRICS_PORT,
    PLURAL,
    READ,
    ROOT,
    VERSION,
    apply,
    bundle,
    condition,
    enforced,
    event,
    get,
    refused,
    settled,
    tm,
    trust,
    wait_for,
)
from kubernetes import client

from unwind.bundle import BUNDLE_NAME, BundleError, load_bundle
from unwind.controlplane.dev import OPERATOR_NAMESPACE, OperatorProcess, kubectl


def test_applying_the_examples_makes_every_manifest_ready_signed_and_published(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient) -> None:
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "apply", "-f", str(ROOT / "manifests")],
                   check=True, capture_output=True)
    for ns in ("payments", "code-hosting"):  # not -A: other tests' namespaces come and go
        kubectl(kubeconfig, "-n", ns, "wait", "--for=condition=Ready", "toolmanifests", "--all", "--timeout=60s")
    for ns in ("payments", "code-hosting"):
        items = client.CustomObjectsApi(k8s_api).list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)["items"]
        for obj in items:
            for type_ in ("Valid", "Approved", "Signed", "Published", "Ready"):
                assert condition(obj, type_)["status"] == "True", (obj["metadata"]["name"], type_)
        assert set(enforced(k8s_api, ns)) == {o["spec"]["tool"] for o in items}
    table = kubectl(kubeconfig, "-n", "payments", "get", "toolmanifests")
    assert table.split()[:7] == ["NAME", "TOOL", "EFFECT", "LIFECYCLE", "VERSION", "READY", "AGE"]
    row = next(line.split() for line in table.splitlines() if "stripe.create_charge" in line)
    assert row[1:6] == ["stripe.create_charge", "compensable", "approved", "1", "True"]
    assert "unwind" in kubectl(kubeconfig, "api-resources", "--categories=unwind")


def test_kubectl_apply_of_an_invalid_manifest_is_refused_with_every_field_path(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    # a rule of the validator, with an unknown field deep down and a wrong duration beside it
    bad = {**CANCEL, "tool": "shop.retry_create", "effect": "compensable", "retry": {"attempts": 2},
           "timeout_ms": "soon",
           "compensation": {"tool": "shop.cancel_order", "verifcation": {"tool": "shop.get_order"}}}
    err = refused(kubeconfig, namespace, tm("bad", bad))
    assert 'admission webhook "toolmanifests.validate.unwind.dev" denied the request' in err
    assert "ToolManifest bad (shop.retry_create) is invalid, 3 errors; fix the spec" in err
    assert "- spec.compensation.verifcation: unknown field 'verifcation' (did you mean 'verification'?)" in err
    assert "- spec.timeout_ms: 'soon' is not a duration" in err
    assert "- spec.retry: retrying a compensable tool could repeat its effect" in err
    # a wrong type on a declared property: the API server's own schema refuses it
    err = refused(kubeconfig, namespace, tm("typed", {**READ, "permission": 5}))
    assert "spec.permission" in err and "string" in err
    # nothing was stored
    assert not kubectl(kubeconfig, "-n", namespace, "get", "tm", "--ignore-not-found", "-o", "name")


def test_a_misspelled_field_is_kept_by_the_api_server_and_refused_by_the_validator(
        operator: OperatorProcess, kubeconfig: Path, namespace: str) -> None:
    err = refused(kubeconfig, namespace, tm("typo", {**READ, "permision": "x"}))
    assert "spec.permision: unknown field 'permision' (did you mean 'permission'?)" in err


def test_a_manifest_that_breaks_the_set_gets_valid_false_with_the_field_path_and_stays_out(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    # set-level rules stay in status: a GitOps apply may bring the missing tool a moment later
    lonely = {**CREATE, "compensation": {**CREATE["compensation"], "tool": "shop.nowhere"}}
    apply(kubeconfig, namespace, tm("cancel", CANCEL), tm("bad", lonely))
    obj = wait_for("bad settled", lambda: settled(k8s_api, namespace, "bad"))
    valid = condition(obj, "Valid")
    assert valid["status"] == "False" and valid["reason"] == "SetValidationFailed"
    assert "compensation.tool" in valid["message"] and "shop.nowhere" in valid["message"]
    assert condition(obj, "Ready")["status"] == "False"
    wait_for("bundle", lambda: enforced(k8s_api, namespace) == {"shop.cancel_order": 1})
    event(k8s_api, namespace, "bad", "SetValidationFailed", "Warning")


def test_an_edit_that_breaks_the_set_keeps_the_last_good_version_in_the_bundle(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("read", READ), tm("cancel", CANCEL), tm("create", CREATE))
    wait_for("published", lambda: enforced(k8s_api, namespace).get("shop.create_order") == 1)
    apply(kubeconfig, namespace, tm("create", {**CREATE, "requires": ["shop.nowhere"]}))
    obj = wait_for("edit settled", lambda: settled(k8s_api, namespace, "create"))
    assert "requires" in condition(obj, "Valid")["message"]
    assert condition(obj, "Published")["reason"] == "LastGoodVersionPublished"
    assert enforced(k8s_api, namespace)["shop.create_order"] == 1
    apply(kubeconfig, namespace, tm("create", {**CREATE, "description": "Create an order."}))
    wait_for("version 3", lambda: enforced(k8s_api, namespace).get("shop.create_order") == 3)


def test_a_draft_is_not_in_the_bundle(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("read", READ), tm("cancel", {**CANCEL, "lifecycle": "draft"}))
    obj = wait_for("draft ready", lambda: settled(k8s_api, namespace, "cancel"))
    assert condition(obj, "Ready")["reason"] == "DraftRecorded"
    wait_for("bundle", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})


def verified(api: client.ApiClient, namespace: str) -> dict[str, str] | None:
    """The root's data when the whole bundle verifies, else None."""
    data = bundle(api, namespace)
    try:
        load_bundle(data, trust(api), namespace=namespace)
    except BundleError:
        return None
    return data[BUNDLE_NAME]


def test_a_hand_edited_bundle_is_detected_and_rewritten(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("read", READ))
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    good = bundle(k8s_api, namespace)
    key = next(k for k in good[BUNDLE_NAME] if k != "index.json")
    tampered = good[BUNDLE_NAME][key].replace("shop:read", "shop:admin")
    client.CoreV1Api(k8s_api).patch_namespaced_config_map(BUNDLE_NAME, namespace, {"data": {key: tampered}})
    wait_for("rewritten", lambda: (root := verified(k8s_api, namespace)) and root[key] == good[BUNDLE_NAME][key])
    assert enforced(k8s_api, namespace) == {"shop.get_order": 1}


def test_a_bundle_stripped_of_its_label_or_made_immutable_is_replaced_not_frozen(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(k8s_api)
    apply(kubeconfig, namespace, tm("read", READ))
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
    core.patch_namespaced_config_map(BUNDLE_NAME, namespace,
                                     {"metadata": {"labels": {"unwind.dev/bundle": None}}, "immutable": True})
    apply(kubeconfig, namespace, tm("list", {**READ, "tool": "shop.list_orders"}))
    wait_for("the new tool published", lambda: "shop.list_orders" in enforced(k8s_api, namespace))
    cm = core.read_namespaced_config_map(BUNDLE_NAME, namespace)
    assert cm.metadata.labels["unwind.dev/bundle"] == "true" and not cm.immutable
    event(k8s_api, namespace, BUNDLE_NAME, "BundleReplaced", "Warning")


def test_deleting_a_manifest_removes_it_from_the_bundle(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("read", READ), tm("cancel", CANCEL))
    wait_for("both", lambda: len(enforced(k8s_api, namespace)) == 2)
    kubectl(kubeconfig, "-n", namespace, "delete", "toolmanifest", "cancel")
    wait_for("removed", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})


def revisions(api: client.ApiClient, namespace: str) -> list[str]:
    items = client.AppsV1Api(api).list_namespaced_controller_revision(namespace).items
    return sorted(r.metadata.name for r in items)


def test_the_operator_killed_refuses_applies_and_restarted_converges_without_extra_versions(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("read", READ), tm("cancel", CANCEL), tm("create", CREATE))
    wait_for("published", lambda: len(enforced(k8s_api, namespace)) == 3)
    # The bundle is written before the statuses: wait for those too before taking the picture.
    for name in ("read", "cancel", "create"):
        wait_for(f"{name} ready", lambda n=name: (o := settled(k8s_api, namespace, n))
                 and condition(o, "Ready")["status"] == "True")
    before = (revisions(k8s_api, namespace), bundle(k8s_api, namespace),
              {n: get(k8s_api, namespace, n)["status"] for n in ("read", "cancel", "create")})
    operator.stop(sig=9)
    # Nothing unchecked gets in: with no operator answering the webhooks, applies are refused
    # and kubectl says which webhook could not be called.
    err = refused(kubeconfig, namespace, tm("create", {**CREATE, "description": "changed while down"}))
    assert 'failed calling webhook "toolmanifests.' in err and "connection refused" in err
    operator.start()
    apply(kubeconfig, namespace, tm("create", {**CREATE, "description": "changed while down"}))
    wait_for("version 2", lambda: enforced(k8s_api, namespace).get("shop.create_order") == 2)
    apply(kubeconfig, namespace, tm("create", CREATE))  # back to the first spec
    wait_for("version 1 again", lambda: enforced(k8s_api, namespace).get("shop.create_order") == 1)
    wait_for("create ready", lambda: (o := settled(k8s_api, namespace, "create"))
             and o["status"].get("publishedVersion") == 1)
    settled_bundle = bundle(k8s_api, namespace)
    operator.stop(sig=9)
    operator.start()
    time.sleep(2)  # a restarted operator re-lists everything; give it time to (not) write
    after = (revisions(k8s_api, namespace), bundle(k8s_api, namespace),
             {n: get(k8s_api, namespace, n)["status"] for n in ("read", "cancel")})
    assert len(after[0]) == len(before[0]) + 1  # only the one real edit made a version
    assert after[1] == settled_bundle  # nothing rewritten after the restart
    assert after[2] == {k: before[2][k] for k in ("read", "cancel")}
    # the number 2 stays taken: the signed index remembers it, so it is never reused
    assert load_bundle(after[1], trust(k8s_api), namespace=namespace).high_water["shop.create_order"] == 2


def test_what_the_operator_writes_shows_its_field_manager(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient) -> None:
    subprocess.run(["kubectl", f"--kubeconfig={kubeconfig}", "apply", "-f", str(ROOT / "manifests")],
                   check=True, capture_output=True)
    kubectl(kubeconfig, "-n", "payments", "wait", "--for=condition=Ready", "toolmanifests", "--all", "--timeout=60s")
    bundle = client.CoreV1Api(k8s_api).read_namespaced_config_map(BUNDLE_NAME, "payments")
    assert {f.manager for f in bundle.metadata.managed_fields} == {"unwind-operator"}
    trust_map = client.CoreV1Api(k8s_api).read_namespaced_config_map("unwind-trust", OPERATOR_NAMESPACE)
    assert "unwind-operator" in {f.manager for f in trust_map.metadata.managed_fields}


def test_the_signing_key_lives_in_a_secret_and_its_public_half_in_the_trust_configmap(
        operator: OperatorProcess, k8s_api: client.ApiClient) -> None:
    secret = client.CoreV1Api(k8s_api).read_namespaced_secret("unwind-signing-key", OPERATOR_NAMESPACE)
    assert "private.pem" in secret.data
    assert len(trust(k8s_api)) >= 1


def test_the_served_schema_carries_descriptions_for_kubectl_explain(
        operator: OperatorProcess, kubeconfig: Path) -> None:
    # OpenAPI v3 (1.27+) explains the whole tree, below fields that keep unknown fields too
    # (OpenAPI v2, which 1.20 published, dropped everything under them)
    assert "One tool an agent may call" in kubectl(kubeconfig, "explain", "toolmanifest.spec")
    deep = kubectl(kubeconfig, "explain", "toolmanifest.spec.compensation.argument_map")
    assert "FIELD: argument_map" in deep, deep
    crd = json.loads(kubectl(kubeconfig, "get", "crd", "toolmanifests.unwind.dev", "-o", "json"))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["compensation"]["description"].startswith("Required for reversible")
    assert "argument_map" in spec["properties"]["compensation"]["properties"]
    assert crd["spec"]["names"]["shortNames"] == ["tm"]


def test_reconciles_and_bundle_writes_are_counted_in_prometheus_metrics(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("read", READ))
    wait_for("published", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})

    def metrics() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=5).read().decode()

    text = wait_for("a finished reconcile", lambda: (t := metrics()) and 'result="ok"' in t and t)
    writes = [line for line in text.splitlines()
              if line.startswith("unwind_bundle_writes_total") and f'namespace="{namespace}"' in line]
    assert writes and float(writes[0].rsplit(" ", 1)[1]) >= 1
    assert 'unwind_reconciles_total{result="ok"}' in text
    assert "unwind_bundle_publish_latency_seconds_count" in text


def test_a_manifest_another_reads_is_held_until_its_readers_are_deleted(
        operator: OperatorProcess, kubeconfig: Path, k8s_api: client.ApiClient, namespace: str) -> None:
    apply(kubeconfig, namespace, tm("read", READ), tm("cancel", CANCEL), tm("create", CREATE))
    wait_for("finalizer", lambda: "unwind.dev/readers" in get(k8s_api, namespace, "cancel")["metadata"].get(
        "finalizers", []))
    kubectl(kubeconfig, "-n", namespace, "delete", "toolmanifest", "cancel", "--wait=false")
    obj = wait_for("held", lambda: (o := get(k8s_api, namespace, "cancel"))
                   and condition(o, "Ready")["reason"] == "DeletionBlocked" and o)
    assert obj["metadata"]["deletionTimestamp"]
    assert "still read by ToolManifest create (compensation.tool)" in condition(obj, "Ready")["message"]
    assert enforced(k8s_api, namespace)["shop.cancel_order"] == 1
    event(k8s_api, namespace, "cancel", "DeletionBlocked")
    kubectl(kubeconfig, "-n", namespace, "delete", "toolmanifest", "create", "--wait=false")
    wait_for("released", lambda: not kubectl(kubeconfig, "-n", namespace, "get", "toolmanifest", "cancel",
                                             "--ignore-not-found"))
    wait_for("bundle", lambda: enforced(k8s_api, namespace) == {"shop.get_order": 1})
