"""Two gateways on one ledger folder; approvals recorded with `unwind approve --ledger`."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx2
import pytest

from .conftest import ROOT, GatewayProc, UpstreamProc, env, start_gateway, stop

COMMENT = {"repo": "octo/hello", "issue": 9, "client_id": "same", "body": "once"}


def unwind(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "unwind.cli.main", *args], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def second_gateway(gateway: GatewayProc, manifests: Path, tmp_path: Path):  # type: ignore[no-untyped-def]
    gw = start_gateway(manifests, gateway.ledger, tmp_path)
    yield gw
    stop(gw.proc)


def test_twenty_concurrent_calls_with_one_key_through_two_gateways_call_the_upstream_once(
        gateway: GatewayProc, second_gateway: GatewayProc, upstream: UpstreamProc,
        run_name: str) -> None:
    def one(n: int) -> int:
        gw = gateway if n % 2 else second_gateway
        return gw.call("github.create_comment", COMMENT, run=run_name, key=f"race-{n}").status_code

    with ThreadPoolExecutor(20) as pool:
        codes = list(pool.map(one, range(20)))
    assert sorted(codes) == [200] + [409] * 19
    assert upstream.count("comments.create") == 1
    entries = gateway.entries(run_name)
    assert len(entries) == 20
    assert sorted(e["seq"] for e in entries) == list(range(1, 21))
    assert [e["state"] for e in entries].count("succeeded") == 1


def wait_past(entry: dict[str, Any], timeout_s: float) -> None:
    """Sleep until the entry's approval timeout has passed (a CLI start can take a second
    on a busy machine, so the timeouts are a few seconds and the wait is measured)."""
    requested = datetime.fromisoformat(entry["times"]["requested"])
    deadline = requested + timedelta(seconds=timeout_s + 0.2)
    time.sleep(max(0.0, (deadline - datetime.now(UTC)).total_seconds()))


def ledger_file(gateway: GatewayProc, run: str) -> str:
    return str(gateway.ledger / f"{run}.json")


def test_a_call_needing_two_approvals_runs_once_after_two_users_of_the_group_approve(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    args = {"order_id": "ap-1", "amount": 1200}
    first = gateway.call("stripe.create_charge", args, run=run_name, key="pay-1")
    assert first.status_code == 428
    assert first.json()["error"]["entry"] == "pay-1"
    [entry] = gateway.entries(run_name)
    assert entry["state"] == "awaiting_approval"
    assert entry["approval"]["rules"] == {"roles": ["finance"], "quorum": 2, "timeout_ms": 900_000,
                                          "on_timeout": "escalate", "escalate_to": ["cfo"]}
    assert entry["approval"]["identities"] == "self-declared"
    polled = httpx2.get(f"{gateway.url}/calls/{run_name}/pay-1").json()
    assert polled["state"] == "awaiting_approval"

    alice = unwind("approve", "--ledger", ledger_file(gateway, run_name), "--entry", "pay-1",
                   "--by", "alice", "--group", "finance")
    assert alice.returncode == 0, alice.stderr
    assert "1 of 2 approvals from groups finance" in alice.stdout and "self-declared" in alice.stdout
    assert gateway.call("stripe.create_charge", args, run=run_name, key="pay-1").status_code == 428
    own = unwind("approve", "--ledger", ledger_file(gateway, run_name), "--entry", "pay-1",
                 "--by", "agent", "--group", "finance")
    assert "four-eyes" in own.stderr
    bob = unwind("approve", "--ledger", ledger_file(gateway, run_name), "--entry", "pay-1",
                 "--by", "bob", "--group", "finance")
    assert "approved by alice, bob" in bob.stdout
    assert upstream.count() == 0
    ran = gateway.call("stripe.create_charge", args, run=run_name, key="pay-1")
    assert ran.status_code == 200 and ran.json()["amount"] == 1200
    again = gateway.call("stripe.create_charge", args, run=run_name, key="pay-1")
    assert again.status_code == 409
    assert upstream.count("charges.create") == 1
    entry, refusal = gateway.entries(run_name)  # the repeat is recorded as a refusal
    assert entry["state"] == "succeeded" and entry["approval"]["state"] == "approved"
    assert refusal["state"] == "refused" and refusal["error"]["code"] == "duplicate"


def test_an_approval_that_times_out_is_denied_and_one_deny_is_final(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    assert gateway.call("test.approve_or_deny", {"title": "a"}, run=run_name, key="t1").status_code == 428
    wait_past(gateway.entries(run_name)[0], 3)
    late = gateway.call("test.approve_or_deny", {"title": "a"}, run=run_name, key="t1")
    assert late.status_code == 403 and late.json()["error"]["code"] == "denied"
    assert "timed out after 3s" in late.json()["error"]["message"]
    assert gateway.call("test.approve_or_deny", {"title": "b"}, run=run_name, key="t2").status_code == 428
    no = unwind("deny", "--ledger", ledger_file(gateway, run_name), "--entry", "t2", "--by", "olga",
                "--group", "ops", "--reason", "not today")
    assert no.returncode == 0 and "denied by olga" in no.stdout
    denied = gateway.call("test.approve_or_deny", {"title": "b"}, run=run_name, key="t2")
    assert denied.status_code == 403 and "not today" in denied.json()["error"]["message"]
    assert upstream.count() == 0
    assert [e["state"] for e in gateway.entries(run_name)] == ["denied", "denied"]


def test_after_the_timeout_the_escalation_group_can_approve(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    assert gateway.call("test.approve_or_escalate", {"title": "e"}, run=run_name, key="e1").status_code == 428
    early = unwind("approve", "--ledger", ledger_file(gateway, run_name), "--entry", "e1",
                   "--by", "carol", "--group", "cfo")
    assert "holds none of groups ops" in early.stderr
    wait_past(gateway.entries(run_name)[0], 4)
    late = unwind("approve", "--ledger", ledger_file(gateway, run_name), "--entry", "e1",
                  "--by", "dave", "--group", "cfo")
    assert "approved by dave" in late.stdout, late.stdout + late.stderr
    assert gateway.call("test.approve_or_escalate", {"title": "e"}, run=run_name, key="e1").status_code == 200


def test_an_approved_entry_runs_only_with_the_arguments_that_were_approved(
        gateway: GatewayProc, run_name: str) -> None:
    assert gateway.call("test.approve_or_escalate", {"title": "x"}, run=run_name, key="z").status_code == 428
    other = gateway.call("test.approve_or_escalate", {"title": "y"}, run=run_name, key="z")
    assert other.status_code == 409 and "other arguments" in other.json()["error"]["message"]


def test_local_approve_explains_what_is_wrong_with_its_arguments(tmp_path: Path) -> None:
    missing = unwind("approve", "--ledger", str(tmp_path / "none.json"), "--entry", "e", "--by", "a")
    assert missing.returncode == 1 and "not a ledger file" in missing.stderr
    no_by = unwind("approve", "--ledger", str(tmp_path / "none.json"), "--entry", "e")
    assert no_by.returncode == 1 and "--ledger needs --by" in no_by.stderr
    both = unwind("approve", "ledger/run-1", "--ledger", "x.json")
    assert both.returncode == 1 and "drop ledger/run-1" in both.stderr
    cluster_by = unwind("approve", "tm/x", "--by", "me")
    assert cluster_by.returncode == 1 and "for local ledgers" in cluster_by.stderr


def test_the_gateway_refuses_to_start_on_a_ledger_folder_it_cannot_write(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    r = unwind("gateway", "--manifests", str(ROOT / "manifests"), "--ledger-dir",
               str(blocker / "ledger"))
    assert r.returncode == 1
    assert "is not writable" in r.stderr and "--ledger-dir" in r.stderr


def test_the_gateway_refuses_to_start_on_manifests_that_are_not_there(tmp_path: Path) -> None:
    # a typo used to leave it serving "not ready" forever
    r = unwind("gateway", "--manifests", str(ROOT / "manifests"), str(tmp_path / "nope"),
               "--ledger-dir", str(tmp_path / "ledger"))
    assert r.returncode == 1
    assert f"--manifests {tmp_path / 'nope'}: no such file or folder" in r.stderr


def test_a_gateway_acting_as_another_actor_may_not_write_into_a_run_it_does_not_own(
        gateway: GatewayProc, manifests: Path, upstream: UpstreamProc, run_name: str, tmp_path: Path) -> None:
    # an agent hiding its calls in another agent's run: that run's rollback would undo them,
    # its own would miss them
    before = upstream.count("comments.create")
    assert gateway.call("github.create_comment", {**COMMENT, "client_id": "mine"}, run=run_name,
                        key="mine-1").status_code == 200
    other = start_gateway(manifests, gateway.ledger, tmp_path, "--actor", "intruder")
    try:
        hidden = other.call("github.create_comment", {**COMMENT, "client_id": "hidden"}, run=run_name, key="hid-1")
        assert hidden.status_code == 403
        error = hidden.json()["error"]
        assert error["code"] == "permission_denied"
        assert f"run {run_name} is recorded as agent's" in error["message"]
        assert "send another X-Unwind-Run" in error["message"]
        assert other.call("no.such_tool", {}, run=run_name, key="hid-2").status_code == 403
        assert other.call("github.create_comment", {**COMMENT, "client_id": "own"}, run=f"{run_name}-own",
                          key="own-1").status_code == 200
    finally:
        stop(other.proc)
    assert [e["id"] for e in gateway.entries(run_name)] == ["mine-1"]  # nothing written there, refusals neither
    assert upstream.count("comments.create") == before + 2  # mine and own; the hidden one never left
