"""The gateway token exchange's checks (operator/exchange.py), pure: who a TokenReview says
presented the token, and whether the pod read now is an injected gateway's."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from test_inject import apply, pod

from unwind.operator.exchange import AUDIENCE, Caller, Denied, caller_of, pod_refusal
from unwind.operator.inject import DEFAULT_API_AUDIENCES, Sidecar, inject

CALLER = Caller("shop", "agent", "agent-1", "uid-1")
SIDECAR = Sidecar("registry.example/unwind:0.1.0", "unwind-system", native=True,
                  exchange=("https://10.0.0.9:9444", "-----BEGIN CERTIFICATE-----\n...", "unwind-webhook.unwind-system.svc"))


def review(**user: Any) -> dict[str, Any]:
    return {"authenticated": True, "audiences": [AUDIENCE],
            "user": {"username": "system:serviceaccount:shop:agent", "groups": ["system:serviceaccounts"],
                     "extra": {"authentication.kubernetes.io/pod-name": ["agent-1"],
                               "authentication.kubernetes.io/pod-uid": ["uid-1"]}, **user}}


def injected() -> dict[str, Any]:
    p = pod()
    out: dict[str, Any] = apply(p, inject(p, "shop", "shop:read", ["shop-api"], SIDECAR))
    out["metadata"]["uid"] = "uid-1"
    return out


def test_the_projected_token_of_a_pods_service_account_names_the_pod() -> None:
    assert caller_of(review()) == CALLER


@pytest.mark.parametrize(("status", "code", "said"), [
    ({"authenticated": False, "error": "token expired"}, 401, "token expired"),
    ({**review(), "audiences": ["https://kubernetes.default.svc"]}, 401, "not for the audience unwind-operator"),
    (review(username="alice"), 403, "not a ServiceAccount"),
    (review(username="system:serviceaccount:shop"), 403, "not a ServiceAccount"),
    (review(extra={}), 403, "not bound to a pod"),  # `kubectl create token`
    (review(extra={"authentication.kubernetes.io/pod-name": ["a", "b"],
                   "authentication.kubernetes.io/pod-uid": ["uid-1"]}), 403, "not bound to a pod"),
])
def test_any_other_token_is_refused_saying_why(status: dict[str, Any], code: int, said: str) -> None:
    with pytest.raises(Denied) as caught:
        caller_of(status)
    assert caught.value.status == code and said in str(caught.value)


def test_the_injection_projects_the_operators_audience_and_says_where_to_trade_it() -> None:
    p = injected()
    (gateway,) = p["spec"]["initContainers"]
    env = {e["name"]: e.get("value") for e in gateway["env"]}
    assert env["UNWIND_TOKEN_EXCHANGE"] == "https://10.0.0.9:9444"
    assert env["UNWIND_EXCHANGE_SERVER_NAME"] == "unwind-webhook.unwind-system.svc"
    assert env["UNWIND_EXCHANGE_CA"].startswith("-----BEGIN CERTIFICATE-----")
    (volume,) = [v for v in p["spec"]["volumes"] if v["name"] == "unwind-token"]
    assert volume["projected"]["sources"][0]["serviceAccountToken"]["audience"] == AUDIENCE
    assert pod_refusal(p, CALLER, DEFAULT_API_AUDIENCES) is None


def test_without_an_exchange_the_gateway_keeps_the_pods_own_token_as_before() -> None:
    p = pod()
    out = apply(p, inject(p, "shop", None, [], Sidecar("img", "unwind-system", native=True)))
    (volume,) = [v for v in out["spec"]["volumes"] if v["name"] == "unwind-token"]
    assert "audience" not in volume["projected"]["sources"][0]["serviceAccountToken"]
    assert "UNWIND_TOKEN_EXCHANGE" not in {e["name"] for e in out["spec"]["initContainers"][0]["env"]}


def edited(change: Any) -> dict[str, Any]:
    p = copy.deepcopy(injected())
    change(p)
    return p


@pytest.mark.parametrize(("change", "said"), [
    (lambda p: p["metadata"].update(uid="uid-2"), "not the pod the token was made for"),
    (lambda p: p["spec"].update(serviceAccountName="other"), "runs as ServiceAccount other"),
    (lambda p: p["metadata"]["labels"].pop("unwind.dev/inject"), "is not labelled unwind.dev/inject=true"),
    (lambda p: p["metadata"]["annotations"].pop("unwind.dev/injected"), "was not injected by the Unwind webhook"),
    (lambda p: p["spec"]["initContainers"].clear(), "holds 0 containers named unwind-gateway"),
    # `kubectl debug` adds an ephemeral container after admission, which no webhook of ours sees
    (lambda p: p["spec"].setdefault("ephemeralContainers", []).append(
        {"name": "debugger", "image": "busybox",
         "volumeMounts": [{"name": "unwind-token", "mountPath": "/t"}]}), "volume 'unwind-token' is the gateway's"),
    (lambda p: p["spec"]["volumes"].append({"name": "mine", "projected": {"sources": [
        {"serviceAccountToken": {"path": "t", "audience": AUDIENCE}}]}}),
     "a token of the audience 'unwind-operator' is the gateway's"),
])
def test_a_pod_that_is_not_an_injected_gateways_as_it_stands_now_gets_no_token(change: Any, said: str) -> None:
    why = pod_refusal(edited(change), CALLER, DEFAULT_API_AUDIENCES)
    assert why is not None and said in why, why


def test_an_agent_pod_projecting_the_operators_audience_itself_is_refused_at_admission() -> None:
    from unwind.operator.inject import isolation_problems

    p = pod(volumes=[{"name": "mine", "projected": {"sources": [
        {"serviceAccountToken": {"path": "t", "audience": AUDIENCE}}]}}])
    (problem,) = isolation_problems(p)
    assert problem.startswith("spec.volumes[0].projected.sources[0].serviceAccountToken: a token of the audience "
                              "'unwind-operator' is the gateway's")


def test_gateways_are_told_the_services_address_and_name_or_the_address_given_and_the_services_name() -> None:
    from types import SimpleNamespace

    from unwind.operator.admission import Refused
    from unwind.operator.hooks import ExchangeAddress, WebhookConfig

    names = WebhookConfig.service_names("unwind-webhook", "unwind-system")
    service = SimpleNamespace(spec=SimpleNamespace(cluster_ip="10.0.0.19", ports=[
        SimpleNamespace(name="webhook", port=443), SimpleNamespace(name="exchange", port=9555)]))
    read: list[str] = []

    def reader(name: str) -> Any:
        read.append(name)
        return service

    config = WebhookConfig(names=names, service="unwind-webhook")
    address = ExchangeAddress(reader, lambda: "CA", config)
    assert address() == ("https://10.0.0.19:9555", "CA", "unwind-webhook.unwind-system.svc")
    assert address()[0] == "https://10.0.0.19:9555" and read == ["unwind-webhook"]  # read once
    relayed = ExchangeAddress(reader, lambda: "CA", WebhookConfig(
        names=names, service="unwind-webhook", exchange_url="https://10.244.0.1:9444/"))
    assert relayed() == ("https://10.244.0.1:9444", "CA", "unwind-webhook.unwind-system.svc")
    beside = ExchangeAddress(reader, lambda: "CA", WebhookConfig(addr="127.0.0.1", exchange_port=4321))
    assert beside() == ("https://127.0.0.1:4321", "CA", "")
    with pytest.raises(Refused, match="certificate is not ready yet"):
        ExchangeAddress(reader, lambda: "", config)()
    headless = SimpleNamespace(spec=SimpleNamespace(cluster_ip="None", ports=[]))
    with pytest.raises(Refused, match="has no cluster IP"):
        ExchangeAddress(lambda name: headless, lambda: "CA", config)()
