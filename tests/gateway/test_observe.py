"""Observe mode (a rollout): policy violations are recorded in the entry and the metrics,
and the call goes on; the write-ahead ledger and duplicate refusal stay in force."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from .conftest import GatewayProc, UpstreamProc, start_gateway, stop
from .test_rest import COMMENT


@pytest.fixture(scope="module")
def observing(manifests: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProc]:
    base = tmp_path_factory.mktemp("observe")
    gw = start_gateway(manifests, base / "ledger", base, "--observe", scopes="repo:read")
    try:
        yield gw
    finally:
        stop(gw.proc)


def test_a_call_outside_the_scopes_runs_and_the_entry_says_what_was_observed(
        observing: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    answer = observing.call("github.create_comment", COMMENT, run=run_name, key="o-1")
    assert answer.status_code == 200, answer.text
    report = json.loads(answer.headers["X-Unwind-Effect"])
    assert any(w.startswith("observed permission_denied: github.create_comment needs permission repo:write")
               for w in report["warnings"])
    (entry,) = observing.entries(run_name)
    assert entry["state"] == "succeeded" and any("observed permission_denied" in w for w in entry["warnings"])
    assert upstream.count("comments.create") == 1
    text = httpx2.get(f"{observing.url}/metrics", timeout=10).text
    assert 'unwind_gateway_observed_violations_total{code="permission_denied",tool="github.create_comment"} 1.0' in text


def test_observe_mode_still_refuses_a_duplicate(observing: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    assert observing.call("github.create_comment", COMMENT, run=run_name, key="d-1").status_code == 200
    again = observing.call("github.create_comment", COMMENT, run=run_name, key="d-2")
    assert again.status_code == 409 and again.json()["error"]["code"] == "duplicate"
    assert upstream.count("comments.create") == 1
