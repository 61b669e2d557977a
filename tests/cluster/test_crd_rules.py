"""The CEL rules of the generated CRDs (x-kubernetes-validations), enforced by the API server
alone: each CRD is installed under a test group of its own, where no webhook of the operator
answers, so what is refused here is refused by the API server whatever runs."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
from cluster_helpers import wait_for
from kubernetes import client

from unwind.api.crd import crd_for
from unwind.api.resources import KINDS, Kind


def kind(name: str) -> Kind:
    return next(k for k in KINDS if k.kind == name)


@pytest.fixture
def test_group(k8s_api: client.ApiClient, namespace: str) -> Iterator[str]:
    """EffectLedger and Approval as the generator writes them, under group <ns>.test.unwind.dev."""
    ext = client.ApiextensionsV1Api(k8s_api)
    group = f"{namespace}.test.unwind.dev"
    names = []
    for k in (kind("EffectLedger"), kind("Approval")):
        crd = copy.deepcopy(crd_for(k))
        crd["metadata"]["name"] = f"{k.plural}.{group}"
        crd["spec"]["group"] = group
        del crd["spec"]["names"]["categories"]
        crd["spec"]["names"].pop("shortNames", None)
        ext.create_custom_resource_definition(crd)
        names.append(crd["metadata"]["name"])
    for name in names:
        wait_for(f"CRD {name} Established", lambda name=name: any(
            c.type == "Established" and c.status == "True"
            for c in ext.read_custom_resource_definition(name).status.conditions or []))
    try:
        yield group
    finally:
        for name in names:
            ext.delete_custom_resource_definition(name)


def refused(call: Any) -> str:
    with pytest.raises(client.ApiException) as exc:
        call()
    assert exc.value.status == 422, exc.value.body
    return str(json.loads(exc.value.body)["message"])


def test_what_a_ledger_records_cannot_change_and_a_rollback_may_be_asked_for(
        k8s_api: client.ApiClient, namespace: str, test_group: str) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    args = (test_group, "v1alpha1", namespace, "effectledgers")
    custom.create_namespaced_custom_object(*args, {
        "apiVersion": f"{test_group}/v1alpha1", "kind": "EffectLedger", "metadata": {"name": "run-1"},
        "spec": {"run": "run-1", "owner": "system:serviceaccount:shop:agent"}})

    def patch(spec: dict[str, Any]) -> Any:
        return lambda: custom.patch_namespaced_custom_object(*args, "run-1", {"spec": spec})

    assert "spec.run: is written by the gateway" in refused(patch({"run": "run-2"}))
    assert "spec.page: is written by the gateway" in refused(patch({"page": 2}))
    assert "spec.owner: is written by the gateway" in refused(patch({"owner": "system:serviceaccount:shop:other"}))
    # the page left out reads as 1: writing it as 1 is no change
    custom.patch_namespaced_custom_object(*args, "run-1", {"spec": {"page": 1}})
    done = custom.patch_namespaced_custom_object(*args, "run-1", {"spec": {"rollback": {"requested": True}}})
    assert done["spec"]["rollback"]["requested"] is True


def test_an_approval_is_a_record_its_spec_never_changes(
        k8s_api: client.ApiClient, namespace: str, test_group: str) -> None:
    custom = client.CustomObjectsApi(k8s_api)
    args = (test_group, "v1alpha1", namespace, "approvals")
    custom.create_namespaced_custom_object(*args, {
        "apiVersion": f"{test_group}/v1alpha1", "kind": "Approval", "metadata": {"name": "ok"},
        "spec": {"target": {"effectLedger": "run-1", "entry": "e-1"}, "decision": "approve"}})
    message = refused(lambda: custom.patch_namespaced_custom_object(*args, "ok", {"spec": {"decision": "deny"}}))
    assert "spec: an Approval is a record and cannot be changed after creation" in message
    custom.patch_namespaced_custom_object(*args, "ok", {"metadata": {"labels": {"seen": "yes"}}})
