"""What the admission webhooks decide, without a cluster: the pure review functions."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from unwind.manifest.canonical import checksum
from unwind.manifest.validate import validate_manifest
from unwind.operator.admission import (
    Refused,
    Request,
    mutate_approval,
    mutate_effectledger,
    mutate_toolmanifest,
    validate_approval,
    validate_toolmanifest,
)
from unwind.operator.identity import (
    Bound,
    Identity,
    rollback_stamped,
    stamp_annotations,
    stamped_identity,
)
from unwind.registry.signing import TrustStore, sign

KEY = Ed25519PrivateKey.generate()
TRUST = TrustStore([KEY.public_key()])
ALICE = Identity("alice", ("dev", "system:authenticated"))
BOB = Identity("bob", ("reviewers", "system:authenticated"))
READ = {"tool": "shop.get_order", "effect": "read_only", "permission": "shop:read"}


def now() -> dt.datetime:
    """Read at each use: a creation stamp verifies only within minutes of the object's
    creationTimestamp, and a whole suite's collection can come 20 minutes before a test."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def created(at: dt.datetime | None = None) -> str:
    """A creationTimestamp as the API server writes it."""
    return (at or now()).strftime("%Y-%m-%dT%H:%M:%SZ")


def signer(message: bytes) -> Any:
    return sign(KEY, message)


def tm(spec: Any, annotations: dict[str, str] | None = None, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest",
            "metadata": {"name": "get-order", "namespace": "shop", "uid": "u-1", "creationTimestamp": created(),
                         **({"annotations": annotations} if annotations else {}), **meta},
            "spec": spec}


def stored_tm(spec: Any, by: Identity = ALICE) -> dict[str, Any]:
    return tm(spec, stamp_annotations("ToolManifest", "shop", spec, by, signer, Bound("get-order", "u-1")))


def approval(spec: Any, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "unwind.dev/v1alpha1", "kind": "Approval",
            "metadata": {"name": "ok", "namespace": "shop", "uid": "a-1", "creationTimestamp": created(),
                         **({"annotations": annotations} if annotations else {})},
            "spec": spec}


def approve_spec(spec: dict[str, Any], decision: str = "approve") -> dict[str, Any]:
    model, _ = validate_manifest(spec)
    assert model is not None
    return {"target": {"toolManifest": "get-order", "checksum": checksum(model)}, "decision": decision}


def req(op: str, new: Any, old: Any = None, who: Identity = ALICE) -> Request:
    return Request(op, "shop", new, old, who)


# ---- ToolManifest: validation -----------------------------------------------------------

def test_a_valid_manifest_is_admitted() -> None:
    validate_toolmanifest(req("CREATE", tm(READ)))


def test_every_error_is_listed_with_its_spec_field_path() -> None:
    bad = {**READ, "effect": "compensable", "retry": {"attempts": 3}, "colour": "red",
           "audit": {"redaction": ["args.card"]}}
    with pytest.raises(Refused) as err:
        validate_toolmanifest(req("CREATE", tm(bad)))
    text = str(err.value)
    assert text.startswith("ToolManifest get-order (shop.get_order) is invalid,")
    assert "- spec.colour: unknown field 'colour'" in text
    assert "- spec.compensation: " in text
    assert "- spec.retry: retrying a compensable tool could repeat its effect" in text
    assert "- spec.audit.redaction[0]: " in text
    assert err.value.code == 422


def test_a_metadata_only_update_of_a_stored_invalid_manifest_passes() -> None:
    bad = {**READ, "effect": "sideways"}
    old = tm(bad)
    new = copy.deepcopy(old)
    new["metadata"]["finalizers"] = ["unwind.dev/readers"]
    validate_toolmanifest(req("UPDATE", new, old))
    with pytest.raises(Refused):
        validate_toolmanifest(req("UPDATE", tm({**bad, "description": "x"}), old))


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=3)
                    | st.dictionaries(st.text(max_size=8), children, max_size=4), max_leaves=20))
def test_no_spec_crashes_the_validating_webhook(spec: Any) -> None:
    try:
        validate_toolmanifest(req("CREATE", tm(spec)))
    except Refused as exc:
        assert str(exc)


# ---- ToolManifest: identity stamps ------------------------------------------------------

def test_a_create_is_stamped_with_the_requesters_identity() -> None:
    annotations = mutate_toolmanifest(req("CREATE", tm(READ)), signer)
    assert annotations["unwind.dev/applied-by"] == "alice"
    assert annotations["unwind.dev/applied-by-groups"] == '["dev", "system:authenticated"]'
    assert stamped_identity("ToolManifest", "shop", READ, annotations, TRUST, tm(READ)["metadata"]) == (ALICE, "")


def test_a_client_that_writes_the_applied_by_annotation_itself_is_refused() -> None:
    with pytest.raises(Refused, match=r"metadata.annotations\[unwind.dev/applied-by\]: is written by the "
                                      r"Unwind admission webhook.*you are 'alice'") as err:
        mutate_toolmanifest(req("CREATE", tm(READ, {"unwind.dev/applied-by": "argocd"})), signer)
    assert err.value.code == 403


def test_sending_back_the_stored_stamp_with_a_new_spec_restamps_it() -> None:
    old = stored_tm(READ, BOB)
    new = copy.deepcopy(old)
    new["spec"] = {**READ, "description": "changed"}
    annotations = mutate_toolmanifest(req("UPDATE", new, old, ALICE), signer)
    assert annotations["unwind.dev/applied-by"] == "alice"


def test_a_metadata_only_update_keeps_the_stamp_even_when_the_client_drops_it() -> None:
    old = stored_tm(READ, BOB)
    new = tm(READ)  # e.g. kubectl replace with a file that has no annotations
    assert mutate_toolmanifest(req("UPDATE", new, old, ALICE), signer) == old["metadata"]["annotations"]
    same = copy.deepcopy(old)
    assert mutate_toolmanifest(req("UPDATE", same, old, ALICE), signer) == {}


def test_changing_a_stored_stamp_is_refused() -> None:
    old = stored_tm(READ, BOB)
    new = copy.deepcopy(old)
    new["metadata"]["annotations"]["unwind.dev/applied-by"] = "alice"
    with pytest.raises(Refused):
        mutate_toolmanifest(req("UPDATE", new, old, ALICE), signer)


# ---- Approval ---------------------------------------------------------------------------

def test_an_approval_is_stamped_and_owned_by_its_target() -> None:
    target = stored_tm(READ, ALICE)
    patch = mutate_approval(req("CREATE", approval(approve_spec(READ)), who=BOB), target, signer, TRUST, True)
    assert patch is not None
    assert patch.annotations["unwind.dev/approver"] == "bob"
    assert patch.owner == {"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest", "name": "get-order",
                           "uid": "u-1", "blockOwnerDeletion": False}
    stamped = approval(approve_spec(READ), patch.annotations)
    validate_approval(req("CREATE", stamped, who=BOB), TRUST)


def test_the_authors_own_approval_is_refused_under_four_eyes() -> None:
    target = stored_tm(READ, ALICE)
    with pytest.raises(Refused, match=r"four-eyes: you \(alice\) last changed the spec"):
        mutate_approval(req("CREATE", approval(approve_spec(READ))), target, signer, TRUST, True)
    assert mutate_approval(req("CREATE", approval(approve_spec(READ))), target, signer, TRUST, False)
    # a deny by the author is allowed: withdrawing your own proposal is no conflict of interest
    assert mutate_approval(req("CREATE", approval(approve_spec(READ, "deny"))), target, signer, TRUST, True)


def test_a_forged_approver_is_refused() -> None:
    forged = approval(approve_spec(READ), {"unwind.dev/approver": "cfo"})
    with pytest.raises(Refused, match=r"metadata.annotations\[unwind.dev/approver\]"):
        mutate_approval(req("CREATE", forged, who=BOB), stored_tm(READ), signer, TRUST, True)


def test_an_approval_not_stamped_by_the_mutating_webhook_is_refused_at_validation() -> None:
    with pytest.raises(Refused, match="not stamped by the Unwind mutating webhook"):
        validate_approval(req("CREATE", approval(approve_spec(READ)), who=BOB), TRUST)
    other = stamp_annotations("Approval", "shop", approve_spec(READ), ALICE, signer, Bound("ok", "", int(now().timestamp())))
    with pytest.raises(Refused):
        validate_approval(req("CREATE", approval(approve_spec(READ), other), who=BOB), TRUST)


def test_an_approval_for_a_stale_checksum_names_the_current_one() -> None:
    target = stored_tm({**READ, "description": "now"}, ALICE)
    with pytest.raises(Refused, match=r"spec.target.checksum: sha256:\w+ is not the current version .* "
                                      r"which is sha256:\w+") as err:
        mutate_approval(req("CREATE", approval(approve_spec(READ)), who=BOB), target, signer, TRUST, True)
    assert err.value.code == 409


def test_an_approval_of_a_missing_target_is_refused() -> None:
    with pytest.raises(Refused, match="ToolManifest 'get-order' does not exist in namespace shop"):
        mutate_approval(req("CREATE", approval(approve_spec(READ)), who=BOB), None, signer, TRUST, True)


@pytest.mark.parametrize(("spec", "message"), [
    ({"target": {"toolManifest": "x"}, "decision": "approve"}, "needs both toolManifest and checksum"),
    ({"target": {"toolManifest": "x", "checksum": "sha256:" + "0" * 64, "entry": "e1"}, "decision": "approve"},
     "names both a ToolManifest and an EffectLedger"),
    ({"target": {}, "decision": "approve"}, "spec.target: is empty"),
    ({"target": {"effectLedger": "run-1", "entry": "e1"}, "decision": "maybe"}, "spec.decision: "),
    ({"target": {"toolManifest": "x", "checksum": "abc"}, "decision": "approve"}, "spec.target.checksum: "),
    ({"target": {"effectLedger": "run-1", "entry": "e1"}, "decision": "approve", "approver": "cfo"},
     "spec.approver: unknown field"),
])
def test_a_malformed_approval_names_the_field(spec: dict[str, Any], message: str) -> None:
    with pytest.raises(Refused, match=message.replace("(", r"\(")):
        mutate_approval(req("CREATE", approval(spec), who=BOB), stored_tm(READ), signer, TRUST, True)


def test_an_approval_cannot_be_changed_after_creation() -> None:
    stamps = stamp_annotations("Approval", "shop", approve_spec(READ), BOB, signer, Bound("ok", "", int(now().timestamp())))
    old = approval(approve_spec(READ), stamps)
    flipped = approval(approve_spec(READ, "deny"), stamps)
    with pytest.raises(Refused, match="an Approval is a record and cannot be changed"):
        validate_approval(req("UPDATE", flipped, old, BOB), TRUST)
    relabelled = copy.deepcopy(old)
    relabelled["metadata"]["labels"] = {"team": "payments"}
    validate_approval(req("UPDATE", relabelled, old, BOB), TRUST)
    renamed = copy.deepcopy(old)
    renamed["metadata"]["annotations"]["unwind.dev/approver"] = "cfo"
    with pytest.raises(Refused, match="the recorded approver cannot be changed"):
        validate_approval(req("UPDATE", renamed, old, BOB), TRUST)


# ---- the dispatch: AdmissionReview in, AdmissionReview out ------------------------------

def dispatcher(targets: dict[str, Any] | None = None) -> Any:
    from unwind.operator.hooks import Admission

    def read(namespace: str, plural: str, name: str) -> Any:
        return (targets or {}).get(name)
    return Admission(read, "unwind-system", True, signer, TRUST)


def review(path: str, obj: Any, user: str = "alice", op: str = "CREATE", namespace: str = "shop") -> Any:
    import asyncio

    data = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": op, "namespace": namespace, "object": obj,
                        "userInfo": {"username": user, "groups": ["dev"]}}}
    return asyncio.run(dispatcher({"get-order": stored_tm(READ, ALICE)}).review(path, data))["response"]


def test_a_stamp_answer_is_a_json_patch_that_adds_the_annotations() -> None:
    import base64
    import json

    answer = review("stamp-toolmanifest", tm(READ))
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["patch"]))
    assert ops[0]["op"] == "add" and ops[0]["path"] == "/metadata/annotations"
    with_some = tm(READ, {"team": "shop"})
    ops = json.loads(base64.b64decode(review("stamp-toolmanifest", with_some)["patch"]))
    assert {o["path"] for o in ops} == {"/metadata/annotations/unwind.dev~1applied-by",
                                        "/metadata/annotations/unwind.dev~1applied-by-groups",
                                        "/metadata/annotations/unwind.dev~1applied-by-stamp"}


def test_a_refusal_is_a_denial_with_its_code_and_message() -> None:
    answer = review("validate-toolmanifest", tm({**READ, "effect": "sideways"}))
    assert answer["allowed"] is False and answer["status"]["code"] == 422
    assert "spec.effect" in answer["status"]["message"]


def test_the_operator_namespace_and_unknown_paths_are_answered_not_crashed() -> None:
    assert review("validate-toolmanifest", tm({"nonsense": 1}), namespace="unwind-system")["allowed"] is True
    answer = review("no-such-hook", tm(READ))
    assert answer["allowed"] is False and "has no handler 'no-such-hook'" in answer["status"]["message"]


def test_an_approval_gets_its_owner_reference_in_the_patch() -> None:
    import base64
    import json

    answer = review("stamp-approval", approval(approve_spec(READ)), user="bob")
    ops = json.loads(base64.b64decode(answer["patch"]))
    assert {"op": "add", "path": "/metadata/ownerReferences", "value": [
        {"apiVersion": "unwind.dev/v1alpha1", "kind": "ToolManifest", "name": "get-order", "uid": "u-1",
         "blockOwnerDeletion": False}]} in ops


@given(st.dictionaries(st.sampled_from(["uid", "operation", "namespace", "object", "oldObject", "userInfo"]),
                       st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=6),
                                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c,
                                                                                         max_size=3),
                                    max_leaves=12)),
       st.sampled_from(["validate-toolmanifest", "stamp-toolmanifest", "stamp-approval", "validate-approval",
                        "stamp-effectledger"]))
def test_no_admission_review_crashes_the_dispatch(request: dict[str, Any], path: str) -> None:
    import asyncio

    answer = asyncio.run(dispatcher().review(path, {"request": request}))["response"]
    assert isinstance(answer["allowed"], bool)
    if not answer["allowed"]:
        assert answer["status"]["message"]


# ---- EffectLedger: who asked for a rollback -------------------------------------------

ROLLBACK = {"requested": True, "reason": "the agent misbehaved", "requestedAt": "2026-11-30T10:00:00Z"}


def ledger(spec: dict[str, Any], annotations: dict[str, str] | None = None, name: str = "run-1") -> dict[str, Any]:
    return {"apiVersion": "unwind.dev/v1alpha1", "kind": "EffectLedger",
            "metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}",
                         **({"annotations": annotations} if annotations else {})},
            "spec": spec}


def requester(obj: dict[str, Any], annotations: dict[str, str]) -> tuple[Identity | None, str]:
    spec = obj["spec"]
    return stamped_identity("EffectLedger", "shop", rollback_stamped(obj["metadata"]["name"], spec.get("rollback")),
                            annotations, TRUST, obj["metadata"])


def test_asking_for_a_rollback_stamps_who_asked_over_the_ledger_and_the_request() -> None:
    old = ledger({"run": "run-1"})
    new = ledger({"run": "run-1", "rollback": ROLLBACK})
    notes = mutate_effectledger(req("UPDATE", new, old, who=BOB), signer)
    assert notes["unwind.dev/rollback-by"] == "bob"
    assert requester(new, notes) == (BOB, "")
    # copied to another ledger with the same request, or kept for another request: no longer bob's
    assert requester(ledger(new["spec"], name="run-2"), notes)[0] is None
    assert requester(ledger({"run": "run-1", "rollback": {**ROLLBACK, "reason": "other"}}), notes)[0] is None


def test_a_ledger_update_that_leaves_the_request_alone_keeps_the_stored_stamp_and_stamps_nobody_new() -> None:
    asked = ledger({"run": "run-1", "rollback": ROLLBACK})
    stored = ledger(asked["spec"], mutate_effectledger(req("UPDATE", asked, ledger({"run": "run-1"}), who=BOB), signer))
    relabelled = ledger(asked["spec"])  # a client that dropped the annotations (kubectl replace)
    assert mutate_effectledger(req("UPDATE", relabelled, stored, who=ALICE), signer) == {
        k: v for k, v in stored["metadata"]["annotations"].items()}
    assert mutate_effectledger(req("UPDATE", ledger({"run": "run-1"}), ledger({"run": "run-1"})), signer) == {}
    assert mutate_effectledger(req("CREATE", asked), signer) == {}  # creates are the gateway's


def test_a_rollback_requester_typed_by_the_client_is_refused() -> None:
    new = ledger({"run": "run-1", "rollback": ROLLBACK}, {"unwind.dev/rollback-by": "carol"})
    with pytest.raises(Refused, match=r"rollback-by\]: is written by the Unwind admission webhook"):
        mutate_effectledger(req("UPDATE", new, ledger({"run": "run-1"})), signer)


def test_what_a_ledger_records_cannot_be_changed_by_someone_asking_for_a_rollback() -> None:
    old = ledger({"run": "run-1", "page": 1})
    for spec, field in (({"run": "run-2", "page": 1}, "run"), ({"run": "run-1", "page": 2}, "page"),
                        ({"page": 1}, "run")):
        with pytest.raises(Refused, match=rf"spec.{field}: is written by the gateway .* set spec.rollback"):
            mutate_effectledger(req("UPDATE", ledger({**spec, "rollback": ROLLBACK}), old), signer)
    # a page left out reads as its default
    assert mutate_effectledger(req("UPDATE", ledger({"run": "run-1", "rollback": ROLLBACK}), old), signer)


def test_the_owner_of_a_run_cannot_be_changed_by_someone_allowed_to_edit_its_ledger() -> None:
    old = ledger({"run": "run-1", "page": 1, "owner": "system:serviceaccount:shop:agent-a"})
    for spec in ({"run": "run-1", "owner": "system:serviceaccount:shop:agent-b"}, {"run": "run-1"}):
        with pytest.raises(Refused, match=r"spec.owner: is written by the gateway"):
            mutate_effectledger(req("UPDATE", ledger({**spec, "rollback": ROLLBACK}), old), signer)


# ---- the injection webhook fails closed for the labelled pods it is called for -------------

def agent_pod(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agent-1", "namespace": "shop", "labels": {"unwind.dev/inject": "true"}},
            "spec": {"serviceAccountName": "agent", "containers": [{"name": "agent", "image": "agent:1"}], **spec}}


def inject_review(pod: dict[str, Any], context: Any, sidecar: bool = True) -> Any:
    import asyncio

    from unwind.operator.hooks import Admission
    from unwind.operator.inject import Sidecar

    admission = Admission(lambda *_: None, "unwind-system", True, signer, TRUST,
                          sidecar=Sidecar("unwind:1", "unwind-system") if sidecar else None, pod_context=context)
    data = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r-1", "operation": "CREATE", "namespace": "shop", "object": pod,
                        "userInfo": {"username": "system:serviceaccount:kube-system:job-controller"}}}
    return asyncio.run(admission.review("inject-gateway", data))["response"]


def test_a_labelled_pod_in_a_namespace_with_a_nan_bundle_is_refused_not_admitted_without_its_gateway() -> None:
    from unwind.operator.inject import gateway_secrets

    crafted = {"unwind-bundle": {"index.json": '{"namespace":"shop","generation":NaN,'
                                               '"signature":{"key_id":"k","value":"AAAA"}}'}}
    answer = inject_review(agent_pod(), lambda ns, sa: ("shop:read", gateway_secrets(crafted, TRUST, ns)))
    assert answer["allowed"] is False and answer["status"]["code"] == 503
    assert "unwind-bundle cannot be read" in answer["status"]["message"]
    assert "patch" not in answer


def test_trouble_reading_the_pods_context_refuses_the_labelled_pod() -> None:
    def broken(namespace: str, account: str) -> Any:
        raise ConnectionError("the API server went away")

    answer = inject_review(agent_pod(), broken)
    assert answer["allowed"] is False and answer["status"]["code"] == 503
    assert "ConnectionError: the API server went away" in answer["status"]["message"]
    assert "not admitted without its gateway" in answer["status"]["message"]


def test_an_operator_without_a_gateway_image_refuses_labelled_pods() -> None:
    answer = inject_review(agent_pod(), lambda ns, sa: (None, set()), sidecar=False)
    assert answer["allowed"] is False and "--gateway-image" in answer["status"]["message"]


def test_the_upstream_secret_in_the_agents_env_refuses_the_pod_at_admission() -> None:
    pod = agent_pod(hostNetwork=True)
    pod["spec"]["containers"][0]["env"] = [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "stripe", "key": "t"}}}]
    answer = inject_review(pod, lambda ns, sa: ("shop:read", {"stripe"}))
    assert answer["allowed"] is False and answer["status"]["code"] == 400
    message = answer["status"]["message"]
    assert "- spec.hostNetwork: true" in message and "- spec.containers[0].env[0].valueFrom.secretKeyRef:" in message
    assert inject_review(agent_pod(), lambda ns, sa: ("shop:read", {"stripe"}))["patchType"] == "JSONPatch"


# ---- the webhook server answers only the API server when given its client CA ----------------

def test_a_caller_without_the_api_servers_client_certificate_gets_no_stamp(tmp_path: Any) -> None:
    import asyncio
    import datetime as dt
    import socket
    import ssl

    import aiohttp

    from unwind.operator.certs import issue, new_ca
    from unwind.operator.hooks import Admission
    from unwind.operator.webhook import ClientAuth, TLSKeeper, WebhookServer

    now = dt.datetime.now(dt.UTC)
    day = dt.timedelta(days=1)
    serving_ca, serving_ca_key = new_ca(now, day)
    client_ca, client_ca_key = new_ca(now, day)
    other_ca, other_ca_key = new_ca(now, day)
    (tmp_path / "client-ca.crt").write_text(client_ca)
    for name, (ca, key), cn in (("apiserver", (client_ca, client_ca_key), "kube-apiserver-webhook"),
                                ("kubelet", (client_ca, client_ca_key), "system:node:n1"),
                                ("forger", (other_ca, other_ca_key), "kube-apiserver-webhook")):
        cert, private = issue(ca, key, [cn], now, day, client=True)
        (tmp_path / f"{name}.pem").write_text(cert + private)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def run() -> dict[str, Any]:
        keeper = TLSKeeper(None, "unwind-system", ["127.0.0.1"], [])  # type: ignore[arg-type]
        keeper._load(*issue(serving_ca, serving_ca_key, ["127.0.0.1"], now, day))
        keeper.ready.set()
        server = WebhookServer(keeper, Admission(lambda *_: None, "unwind-system", True, signer, TRUST),
                               "127.0.0.1", port, ClientAuth(str(tmp_path / "client-ca.crt"),
                                                             ("kube-apiserver-webhook",)))
        task = asyncio.create_task(server.serve())
        await asyncio.sleep(0.5)
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "r", "operation": "CREATE", "namespace": "shop", "object": tm(READ),
                            "userInfo": {"username": "admin", "groups": ["system:masters"]}}}
        out: dict[str, Any] = {}
        for who in ("apiserver", "kubelet", "forger", None):
            context = ssl.create_default_context(cadata=serving_ca)
            if who:
                context.load_cert_chain(str(tmp_path / f"{who}.pem"))
            try:
                async with aiohttp.ClientSession() as session, session.post(
                        f"https://127.0.0.1:{port}/stamp-toolmanifest", json=body, ssl=context) as answer:
                    out[str(who)] = answer.status
            except (aiohttp.ClientError, ssl.SSLError, OSError) as exc:
                out[str(who)] = type(exc).__name__
        task.cancel()
        return out

    statuses = asyncio.run(run())
    assert statuses["apiserver"] == 200
    assert statuses["kubelet"] == 403  # signed by the CA, not a name the operator answers
    assert statuses["forger"] != 200 and statuses["None"] != 200  # refused in the TLS handshake


def test_client_names_without_a_client_ca_are_a_configuration_error() -> None:
    import ssl

    from unwind.operator.webhook import ClientAuth

    with pytest.raises(ValueError, match="UNWIND_WEBHOOK_CLIENT_CA"):
        ClientAuth("", ("kube-apiserver",)).require(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    with pytest.raises(ValueError, match="cannot load the webhook client CA"):
        ClientAuth("/nonexistent/ca.crt").require(ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))


# ---- stamps are bound to the object they were made for -----------------------------------

def test_a_stamp_made_for_object_uid_x_does_not_verify_on_object_uid_y() -> None:
    old = stored_tm(READ, BOB)
    new = copy.deepcopy(old)
    new["spec"] = {**READ, "description": "changed"}
    notes = mutate_toolmanifest(req("UPDATE", new, old, ALICE), signer)
    assert notes["unwind.dev/applied-by-stamp"].startswith("uid;")
    meta = new["metadata"]
    assert stamped_identity("ToolManifest", "shop", new["spec"], notes, TRUST, meta) == (ALICE, "")
    # the same name and spec, deleted and created again: another object
    recreated = {**meta, "uid": "u-2"}
    who, why = stamped_identity("ToolManifest", "shop", new["spec"], notes, TRUST, recreated)
    assert who is None and "for this object" in why and "copied from another object" in why
    assert stamped_identity("ToolManifest", "shop", new["spec"], notes, TRUST, {**meta, "name": "other"})[0] is None


def test_a_stamp_made_at_creation_verifies_only_on_the_object_of_that_name_created_then() -> None:
    notes = mutate_toolmanifest(req("CREATE", tm(READ)), signer)
    assert notes["unwind.dev/applied-by-stamp"].startswith("created@")
    meta = tm(READ)["metadata"]
    assert stamped_identity("ToolManifest", "shop", READ, notes, TRUST, meta) == (ALICE, "")
    later = {**meta, "creationTimestamp": created(now() + dt.timedelta(hours=1))}
    who, why = stamped_identity("ToolManifest", "shop", READ, notes, TRUST, later)
    assert who is None and "it was copied" in why
    assert stamped_identity("ToolManifest", "shop", READ, notes, TRUST, {**meta, "name": "other"})[0] is None
    assert stamped_identity("ToolManifest", "shop", READ, notes, TRUST, {"name": "get-order"})[0] is None


def test_a_stamp_forged_through_a_made_up_review_does_not_verify_on_an_existing_object() -> None:
    import base64
    import json

    existing = tm(READ)
    existing["metadata"].update(uid="u-1", creationTimestamp="2026-01-01T00:00:00Z")

    def stamp_from(op: str, obj: Any) -> dict[str, str]:
        answer = review("stamp-toolmanifest", obj, user="system:serviceaccount:argocd:argocd-application-controller",
                        op=op)
        assert answer["allowed"] is True
        ops = json.loads(base64.b64decode(answer["patch"]))
        return next(o["value"] for o in ops if o["path"] == "/metadata/annotations")  # type: ignore[no-any-return]

    made_up_create = tm(READ)
    del made_up_create["metadata"]["uid"]
    for forged in (stamp_from("CREATE", made_up_create), stamp_from("UPDATE", tm(READ, uid="u-forged"))):
        assert stamped_identity("ToolManifest", "shop", READ, forged, TRUST, existing["metadata"])[0] is None
    answer = review("stamp-toolmanifest", {**tm(READ), "metadata": {"name": "get-order"}}, op="UPDATE")
    assert answer["allowed"] is False and "metadata.uid" in answer["status"]["message"]


def test_an_approval_with_only_generate_name_is_named_by_the_webhook_so_its_stamp_can_name_it() -> None:
    import base64
    import json

    made = approval(approve_spec(READ))
    made["metadata"] = {"generateName": "approve-get-order-", "namespace": "shop"}
    answer = review("stamp-approval", made, user="bob")
    ops = json.loads(base64.b64decode(answer["patch"]))
    name = next(o["value"] for o in ops if o["path"] == "/metadata/name")
    assert name.startswith("approve-get-order-") and len(name) == len("approve-get-order-") + 5
    notes = next(o["value"] for o in ops if o["path"] == "/metadata/annotations")
    stored = {"name": name, "uid": "a-9", "creationTimestamp": created()}
    assert stamped_identity("Approval", "shop", made["spec"], notes, TRUST, stored)[0] == Identity("bob", ("dev",))


def test_a_stamp_from_before_stamps_were_bound_still_counts() -> None:
    from unwind.operator.identity import stamp_message

    sig = signer(stamp_message("ToolManifest", "shop", READ, ALICE))
    legacy = {"unwind.dev/applied-by": "alice", "unwind.dev/applied-by-groups": '["dev", "system:authenticated"]',
              "unwind.dev/applied-by-stamp": f"{sig.key_id}:{sig.value}"}
    assert stamped_identity("ToolManifest", "shop", READ, legacy, TRUST, tm(READ)["metadata"]) == (ALICE, "")
