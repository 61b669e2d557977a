"""Issue 17, attacking as the agent: approvals of calls, who owns a run, reading other
actors' entries, and how much one agent may create (docs/security.md, "Ledgers, runs and
approvals of calls")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest

from .conftest import ROOT, GatewayProc, UpstreamProc, env, start_gateway, stop


def unwind(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "unwind.cli.main", *args], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=60)


def release(repo: str) -> dict[str, str]:
    return {"repo": repo, "tag": "v1.0.0", "name": "one"}


def test_an_approval_of_a_failed_release_of_repo_a_does_not_publish_repo_b_under_the_same_key(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    assert gateway.call("github.create_release", release("acme/a"), run=run_name, key="rel").status_code == 428
    ok = unwind("approve", "--ledger", str(gateway.ledger / f"{run_name}.json"), "--entry", "rel",
                "--by", "rita", "--group", "release-managers")
    assert ok.returncode == 0 and "approved by rita" in ok.stdout, ok.stdout + ok.stderr
    upstream.behave("releases.create", "fail", status=422)
    failed = gateway.call("github.create_release", release("acme/a"), run=run_name, key="rel")
    assert failed.status_code == 422  # upstream_rejected: the upstream refused it
    upstream.behave("releases.create", "ok")

    other = gateway.call("github.create_release", release("acme/b"), run=run_name, key="rel")
    assert other.status_code == 428, other.text
    again = gateway.call("github.create_release", release("acme/b"), run=run_name, key="rel")
    assert again.status_code == 428, again.text
    assert upstream.count("releases.create") == 1  # only the approved, failed call of repo A
    [entry] = gateway.entries(run_name)
    assert entry["state"] == "awaiting_approval"
    assert entry["approval"]["decisions"] == [] and entry["approval"]["state"] == "awaiting_approval"
    [attempt] = entry["attempts"]
    assert attempt["state"] == "failed" and attempt["approval"]["state"] == "approved"
    assert attempt["arguments_sha256"] != entry["arguments_sha256"]


@pytest.fixture
def gateway_b(manifests: Path, gateway: GatewayProc, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Another agent's gateway on the same ledger folder."""
    gw = start_gateway(manifests, gateway.ledger, tmp_path, "--actor", "agent-b")
    yield gw
    stop(gw.proc)


ISSUE = {"number": 1}


def test_a_dry_run_into_a_run_nobody_wrote_yet_does_not_let_that_gateway_write_into_it_later(
        gateway: GatewayProc, gateway_b: GatewayProc, run_name: str) -> None:
    dry = gateway_b.call("github.get_issue", ISSUE, run=run_name, dry_run=True)
    assert dry.status_code == 200 and dry.json()["dry_run"] is True
    assert gateway.call("github.get_issue", ISSUE, run=run_name, key="a-1").status_code == 502
    stolen = gateway_b.call("github.get_issue", ISSUE, run=run_name, key="b-1")
    assert stolen.status_code == 403, stolen.text
    assert stolen.json()["error"]["code"] == "permission_denied"
    assert "recorded as agent's" in stolen.json()["error"]["message"]
    assert [(e["id"], e["actor"]) for e in gateway.entries(run_name)] == [("a-1", "agent")]
    ledger = json.loads((gateway.ledger / f"{run_name}.json").read_text())
    assert ledger["spec"]["owner"] == "agent"


def test_another_agents_gateway_cannot_read_an_entry_of_a_run_it_does_not_own(
        gateway: GatewayProc, gateway_b: GatewayProc, run_name: str) -> None:
    assert gateway.call("github.get_issue", ISSUE, run=run_name, key="mine").status_code == 502
    assert httpx2.get(f"{gateway.url}/calls/{run_name}/mine", timeout=10).status_code == 200
    other = httpx2.get(f"{gateway_b.url}/calls/{run_name}/mine", timeout=10)
    assert other.status_code == 403 and other.json()["error"]["code"] == "permission_denied"
    assert "mine" not in other.text.replace(f"/{run_name}/mine", "")


def test_one_agent_cannot_make_more_runs_than_its_gateway_allows(
        manifests: Path, upstream: UpstreamProc, tmp_path: Path) -> None:
    gw = start_gateway(manifests, tmp_path / "ledger", tmp_path, "--max-runs", "3")
    try:
        codes = [gw.call("github.get_issue", ISSUE, run=f"many-{n}").status_code for n in range(5)]
        assert codes[:3] == [502] * 3 and codes[3:] == [429, 429], codes
        refused = gw.call("github.get_issue", ISSUE, run="many-9")
        assert refused.json()["error"]["code"] == "rate_limited"
        assert "--max-runs" in refused.json()["error"]["message"]
        assert gw.call("github.get_issue", ISSUE, run="many-0").status_code == 502  # a run in use
        assert sorted(p.name for p in (tmp_path / "ledger").glob("*.json")) == [
            "many-0.json", "many-1.json", "many-2.json"]
    finally:
        stop(gw.proc)


def test_one_run_takes_no_more_entries_than_the_gateway_allows(
        manifests: Path, upstream: UpstreamProc, tmp_path: Path) -> None:
    gw = start_gateway(manifests, tmp_path / "ledger", tmp_path, env_extra={
        "UNWIND_MAX_ENTRIES_PER_RUN": "2"})
    try:
        codes = [gw.call("github.get_issue", ISSUE, run="full").status_code for _ in range(3)]
        assert codes == [502, 502, 429], codes
        assert len(gw.entries("full")) == 2
    finally:
        stop(gw.proc)


def test_the_gateway_refuses_a_limit_that_is_not_a_number(manifests: Path, tmp_path: Path) -> None:
    bad = unwind("gateway", "--manifests", str(manifests), "--ledger-dir", str(tmp_path),
                 "--max-runs", "lots")
    assert bad.returncode == 1 and "--max-runs (or UNWIND_MAX_RUNS) 'lots'" in bad.stderr
