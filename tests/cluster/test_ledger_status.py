"""Every field of an EffectLedger's status through the real API server's status subresource:
what the operator and the gateway write (api.crd.storable) is stored as sent and reads back
as the same model, whichever optional fields are absent, null or set (issue 18 #1)."""

from __future__ import annotations

import types
from typing import Any, Union, get_args, get_origin

import pytest
from cluster_helpers import GROUP, VERSION
from kubernetes import client
from pydantic import BaseModel

from tests.model_values import value_for
from unwind.api.crd import storable_status
from unwind.api.resources import LedgerStatus
from unwind.controlplane.dev import OperatorProcess
from unwind.ledger.entry import ApprovalDecision, ApprovalRulesRecord, Entry, EntryApproval, Times


def explicit_nulls(value: Any, model: type[BaseModel]) -> Any:
    """``value`` (a model's JSON) with every optional field that is absent written as null."""
    out = dict(value)
    for name, f in model.model_fields.items():
        origin, args = get_origin(f.annotation), get_args(f.annotation)
        inner = [a for a in args if a is not type(None)] if origin in (Union, types.UnionType) else [f.annotation]
        if name not in out and type(None) in args:
            out[name] = None
        elif name in out and len(inner) == 1:
            sub, sub_args = inner[0], get_args(inner[0])
            if isinstance(sub, type) and issubclass(sub, BaseModel) and isinstance(out[name], dict):
                out[name] = explicit_nulls(out[name], sub)
            elif get_origin(sub) is list and sub_args and isinstance(sub_args[0], type) \
                    and issubclass(sub_args[0], BaseModel):
                out[name] = [explicit_nulls(v, sub_args[0]) for v in out[name]]
    return out


def round_trip(api: client.ApiClient, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
    custom: Any = client.CustomObjectsApi(api)
    obj = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "effectledgers", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "EffectLedger", "metadata": {"name": name},
        "spec": {"run": name}})
    obj["status"] = status
    custom.replace_namespaced_custom_object_status(GROUP, VERSION, namespace, "effectledgers", name, obj)
    read = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "effectledgers", name)
    return dict(read["status"])


@pytest.mark.parametrize("mode", ["bare", "skeleton", "full"])
def test_every_field_of_a_ledger_status_round_trips_through_the_status_subresource(
        operator: OperatorProcess, k8s_api: client.ApiClient, namespace: str, mode: str) -> None:
    model = LedgerStatus.model_validate(value_for(LedgerStatus, mode))
    # as a careless writer would send it: every None and "" default included
    written = storable_status("EffectLedger", model.model_dump(mode="json"))
    read = round_trip(k8s_api, namespace, f"fields-{mode}", written)
    assert read == written  # stored exactly as sent
    if mode == "skeleton":  # the reason-less decision of issue 18 is in it
        assert "reason" not in written["entries"][0]["approval"]["decisions"][0]
    assert LedgerStatus.model_validate(read) == model


def test_every_optional_field_written_as_an_explicit_null_is_accepted_and_reads_back_the_same(
        operator: OperatorProcess, k8s_api: client.ApiClient, namespace: str) -> None:
    model = LedgerStatus.model_validate(value_for(LedgerStatus, "skeleton"))
    raw = explicit_nulls(storable_status("EffectLedger", model.model_dump(mode="json")), LedgerStatus)
    assert raw["next"] is None and raw["entries"][0]["approval"]["rules"]["timeout_ms"] is None
    read = round_trip(k8s_api, namespace, "nulls", raw)
    assert LedgerStatus.model_validate(read) == model


def test_an_approval_decision_without_a_reason_round_trips_as_dumped_and_as_the_operator_writes_it(
        operator: OperatorProcess, k8s_api: client.ApiClient, namespace: str) -> None:
    """Issue 18's wedged rollback came from the 1.20 API server refusing the model's
    ``reason: ""`` as ``Invalid value: "null"``; a current one keeps the empty string, and the
    operator's storable form (which leaves it out) still round-trips, for older servers."""
    decision = ApprovalDecision(name="dave-ok", user="dave", groups=["finance"], decision="approve",
                                created="2026-12-02T10:00:00Z")
    entry = Entry(id="charge-1", tool="stripe.create_charge", actor="agent", state="succeeded",
                  approval=EntryApproval(rules=ApprovalRulesRecord(roles=["finance"], quorum=1),
                                         identities="kubernetes", decisions=[decision], state="approved",
                                         message="approved by dave"),
                  times=Times(requested="2026-12-02T10:00:00Z"))
    dumped = round_trip(k8s_api, namespace, "as-dumped", {"entries": [entry.to_json()]})
    assert dumped["entries"][0]["approval"]["decisions"][0]["reason"] == ""
    assert Entry.model_validate(dumped["entries"][0]) == entry
    read = round_trip(k8s_api, namespace, "as-written", storable_status("EffectLedger", {"entries": [entry.to_json()]}))
    assert Entry.model_validate(read["entries"][0]) == entry
