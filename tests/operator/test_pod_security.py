"""What Unwind adds to a pod, and the pods it makes, pass Pod Security "restricted".

The agent's own containers are the user's: the tests start from an agent pod that passes
the profile and check that the injected gateway (either form) keeps it passing, and that
an undo Job's pod passes by itself.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pss_restricted import CONTROLS, violations
from test_inject import PROJECTED_TOKEN, SECRET_TOKEN, apply, defaulted_pod

from unwind.operator.inject import Sidecar, inject
from unwind.operator.undojob import job_body

RESTRICTED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                        "runAsNonRoot": True, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}}


def restricted_agent(token_volume: dict[str, Any], *, pod_level: bool) -> dict[str, Any]:
    """An agent pod that passes the profile: its settings on the pod (the gateway then
    inherits what it does not set) or only on its own containers (the gateway must bring
    its own)."""
    p = defaulted_pod(copy.deepcopy(token_volume))
    spec = p["spec"]
    if pod_level:
        spec["securityContext"] = {"runAsNonRoot": True, "runAsUser": 1000,
                                   "seccompProfile": {"type": "RuntimeDefault"}}
        for c in [*spec["initContainers"], *spec["containers"]]:
            c["securityContext"] = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    else:
        for c in [*spec["initContainers"], *spec["containers"]]:
            c["securityContext"] = copy.deepcopy(RESTRICTED_CONTAINER)
    return p


@pytest.mark.parametrize("native", [False, True], ids=["container", "native"])
@pytest.mark.parametrize("pod_level", [True, False], ids=["pod-level", "container-level"])
@pytest.mark.parametrize("token_volume", [SECRET_TOKEN, PROJECTED_TOKEN], ids=["1.20", "1.22"])
def test_the_gateway_keeps_a_restricted_pod_restricted(native: bool, pod_level: bool,
                                                       token_volume: dict[str, Any]) -> None:
    p = restricted_agent(token_volume, pod_level=pod_level)
    assert violations(p["spec"]) == []
    sidecar = Sidecar("registry.example/unwind:0.1.0", "unwind-system", native=native)
    out = apply(p, inject(p, "shop", "shop:read", {"stripe-key"}, sidecar))
    assert violations(out["spec"]) == []


def test_an_undo_jobs_pod_is_restricted() -> None:
    job = job_body(name="r-undo-0-abc", ledger="r", uid="u", entry="e", step="0", text="{}",
                   image="registry.example/unwind:0.1.0", deadline=100, manifests=[])
    assert violations(job["spec"]["template"]["spec"]) == []


def test_the_checker_names_each_control_a_pod_breaks() -> None:
    spec = {"hostNetwork": True, "hostPID": True,
            "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "1"}],
                                "seLinuxOptions": {"user": "root"}},
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}, {"name": "nfs", "nfs": {"server": "x"}}],
            "containers": [{"name": "bad", "image": "x", "ports": [{"containerPort": 80, "hostPort": 80}],
                            "securityContext": {"privileged": True, "runAsUser": 0, "procMount": "Unmasked",
                                                "capabilities": {"add": ["SYS_ADMIN"]},
                                                "seccompProfile": {"type": "Unconfined"},
                                                "appArmorProfile": {"type": "Unconfined"},
                                                "windowsOptions": {"hostProcess": True}}}]}
    broken = {v.split(":")[0] for v in violations(spec)}
    assert broken == set(CONTROLS)
    # the gateway's own context without seccomp, as it was: flagged when the pod sets none
    lax = restricted_agent(SECRET_TOKEN, pod_level=False)
    del lax["spec"]["containers"][0]["securityContext"]["seccompProfile"]
    assert violations(lax["spec"]) == ["Seccomp: spec.containers[0].securityContext.seccompProfile"]
