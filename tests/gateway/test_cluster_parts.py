"""Pure parts of cluster mode: the in-cluster configuration, the token, entries as written."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from unwind.gateway.kube import InClusterConfig, KubeClient, KubeConfigError, token_subject
from unwind.ledger.clusterstore import compact_entry, lease_name
from unwind.ledger.entry import ApprovalDecision, Entry, EntryApproval, Times
from unwind.ledger.store import lock_name


def jwt(claims: dict[str, object]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"eyJhbGciOiJSUzI1NiJ9.{body}.signature"


@pytest.fixture
def mounted(tmp_path: Path) -> Path:
    (tmp_path / "token").write_text(jwt({"sub": "system:serviceaccount:payments:agent"}) + "\n")
    (tmp_path / "ca.crt").write_text("unused")
    return tmp_path


def test_the_api_server_comes_from_the_service_env_and_the_ca_sits_beside_the_token(mounted: Path) -> None:
    config = InClusterConfig.from_env({"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                                       "KUBERNETES_SERVICE_PORT": "443",
                                       "UNWIND_TOKEN_FILE": str(mounted / "token")})
    assert config.server == "https://10.0.0.1:443"
    assert config.ca_file == mounted / "ca.crt"
    ipv6 = InClusterConfig.from_env({"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "6443"},
                                    token_file=str(mounted / "token"))
    assert ipv6.server == "https://[fd00::1]:6443"


def test_outside_a_pod_the_error_names_the_variables_and_local_mode() -> None:
    with pytest.raises(KubeConfigError, match=r"KUBERNETES_SERVICE_HOST.*--manifests"):
        InClusterConfig.from_env({})


def test_a_missing_token_file_names_the_variable_that_moves_it(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "1",
           "UNWIND_TOKEN_FILE": str(tmp_path / "none")}
    with pytest.raises(KubeConfigError, match="UNWIND_TOKEN_FILE"):
        InClusterConfig.from_env(env)


def test_a_rotated_token_is_read_again(mounted: Path) -> None:
    client = KubeClient(InClusterConfig("https://127.0.0.1:1", mounted / "token", mounted / "ca.crt"))
    first = client.token()
    assert token_subject(first) == "system:serviceaccount:payments:agent"
    rotated = jwt({"sub": "system:serviceaccount:payments:agent", "n": 2})
    (mounted / "token").write_text(rotated)
    os.utime(mounted / "token", ns=(1, 2))  # a different mtime even within one clock tick
    assert client.token() == rotated


def test_a_token_that_is_not_a_jwt_has_no_subject() -> None:
    assert token_subject("opaque") is None
    assert token_subject("a.!!!.c") is None


def test_empty_strings_leave_the_typed_fields_of_an_entry_and_stay_in_the_callers_data() -> None:
    entry = Entry(id="e", tool="t", actor="a", state="awaiting_approval",
                  times=Times(requested="2026-01-01T00:00:00.000Z"),
                  approval=EntryApproval(rules={"roles": ["ops"]}, identities="kubernetes",  # type: ignore[arg-type]
                                         decisions=[ApprovalDecision(name="d", user="u", decision="approve",
                                                                     created="2026-01-01T00:00:01.000Z")]),
                  report={"undo_unavailable": ""}, handle={"args": {"note": ""}, "result": {}})  # type: ignore[arg-type]
    written = compact_entry(entry.to_json())
    assert "reason" not in written["approval"]["decisions"][0]
    assert "message" not in written["approval"]
    assert written["report"] == {"undo_unavailable": ""}
    assert written["handle"]["args"] == {"note": ""}
    assert Entry.model_validate(written) == entry  # read back, the defaults fill them in


def test_a_key_lease_is_named_by_the_hash_and_never_spells_the_key() -> None:
    name = lease_name(lock_name("global", run="r", actor="a", tool="stripe.charge", key="card-4242"))
    assert name.startswith("unwind-key-") and len(name) == len("unwind-key-") + 40
    assert "4242" not in name
