"""`unwind undo-step`: one step against the real test upstream, as a Job runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2

from gateway.conftest import ROOT, env
from unwind.undo.runner import MESSAGE_LIMIT, fit, parse_step, run_step
from unwind.upstream.client import Upstream
from unwind.upstream.secrets import LocalSecrets

from .conftest import UpstreamProc


def tool(name: str, effect: str, url: str, method: str = "POST", **extra: Any) -> dict[str, Any]:
    return {"tool": name, "effect": effect, "permission": "p:w",
            "upstream": {"url": url, "method": method}, **extra}


def charge(upstream: UpstreamProc, order: str = "o1") -> dict[str, Any]:
    return dict(httpx2.post(f"{upstream.url}/charges", json={"order_id": order, "amount": 5},
                            headers={"Idempotency-Key": f"charge-{order}"}, timeout=5).json())


def refund_step(upstream: UpstreamProc, charge_id: str, *, expect: Any = True, retries: int = 2,
                refund: dict[str, Any] | None = None) -> dict[str, Any]:
    u = upstream.url
    return {
        "version": 1, "ledger": "run-1",
        "step": {"entry": "pay-1", "tool": "stripe.create_charge", "action": "compensate",
                 "undo_tool": "stripe.refund", "arguments": {"charge_id": charge_id},
                 "residue": [], "requires_approval": False, "reason": "test"},
        "idempotency_key": "unwind-compensate-0123",
        "manifest": refund or tool("stripe.refund", "idempotent",
                                   u + "/charges/{{args.charge_id}}/refund"),
        "verification": {"manifest": tool("stripe.get_charge", "read_only", u + "/charges", "GET"),
                         "arguments": {"charge_id": charge_id}, "expect": {"refunded": expect},
                         "retries": retries, "backoff_ms": 40},
        "timeout_ms": None, "effect": None}


def lookup_step(upstream: UpstreamProc, key: str) -> dict[str, Any]:
    create = tool("stripe.create_charge", "compensable", upstream.url + "/charges",
                  compensation={"tool": "stripe.refund", "argument_map": {"charge_id": "$result.id"}})
    return {
        "version": 1, "ledger": "run-1",
        "step": {"entry": "pay-1", "tool": "stripe.create_charge", "action": "lookup",
                 "undo_tool": "stripe.get_charge", "arguments": {"idempotency_key": key},
                 "residue": [], "requires_approval": False, "reason": "test"},
        "idempotency_key": None,
        "manifest": tool("stripe.get_charge", "read_only", upstream.url + "/charges", "GET"),
        "verification": None, "timeout_ms": None,
        "effect": {"manifest": create, "handle": {"args": {}, "result": {}}}}


def undo_step(*argv: str, stdin: str | None = None, **environ: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "unwind.cli.main", "undo-step", *argv],
                          input=stdin, capture_output=True, text=True, cwd=ROOT,
                          env={**env(), **environ}, timeout=60, check=False)


async def run(spec: dict[str, Any], sleeps: list[float] | None = None) -> dict[str, Any]:
    async def sleep(seconds: float) -> None:
        if sleeps is not None:
            sleeps.append(seconds)
    upstream = Upstream()
    try:
        return await run_step(parse_step(spec), upstream, LocalSecrets(), sleep=sleep)
    finally:
        await upstream.aclose()


def test_a_step_from_a_file_prints_one_json_line_and_writes_the_termination_message(
        upstream: UpstreamProc, tmp_path: Path) -> None:
    ch = charge(upstream)
    (tmp_path / "step.json").write_text(json.dumps(refund_step(upstream, ch["id"])))
    log = tmp_path / "termination-log"
    done = undo_step("--step", str(tmp_path / "step.json"), UNWIND_TERMINATION_LOG=str(log))
    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    result = json.loads(line)
    assert log.read_text() == line and len(line.encode()) <= MESSAGE_LIMIT
    assert (result["ok"], result["outcome"], result["entry_state"]) == (True, "undone", "undone")
    assert result["verification"] == {"tool": "stripe.get_charge", "attempts": 1, "matched": True}
    assert result["idempotency_key"] == "unwind-compensate-0123"
    [refund] = [r for r in upstream.admin("requests")["requests"] if r["route"] == "charges.refund"]
    assert refund["idempotency_key"] == "unwind-compensate-0123"


def test_a_step_from_the_environment_runs_as_a_job_passes_it_and_a_retry_is_deduplicated(
        upstream: UpstreamProc, tmp_path: Path) -> None:
    ch = charge(upstream)
    step = json.dumps(refund_step(upstream, ch["id"]))
    for _ in range(2):  # a Job retried after its pod died: the same key
        done = undo_step(UNWIND_STEP=step, UNWIND_TERMINATION_LOG=str(tmp_path / "log"))
        assert done.returncode == 0, done.stderr
    listing = upstream.admin("requests")
    assert listing["by_route"]["charges.refund"] == 2
    assert listing["effects_by_route"]["charges.refund"] == 1


def test_a_step_that_is_not_valid_fails_naming_the_field(tmp_path: Path) -> None:
    done = undo_step("--step", "-", stdin=json.dumps({"version": 1, "ledger": "run-1"}),
                     UNWIND_TERMINATION_LOG=str(tmp_path / "log"))
    assert done.returncode == 1
    result = json.loads(done.stdout)
    assert result["outcome"] == "invalid_step" and result["ok"] is False
    assert result["reason"] == "the step input is not valid: step: Field required"
    assert json.loads((tmp_path / "log").read_text()) == result


async def test_the_read_back_is_tried_retries_times_with_a_doubling_backoff(
        upstream: UpstreamProc) -> None:
    ch = charge(upstream)
    sleeps: list[float] = []
    result = await run(refund_step(upstream, ch["id"], expect="never", retries=3), sleeps)
    assert sleeps == [0.04, 0.08]
    assert (result["ok"], result["outcome"], result["entry_state"]) == (False, "undo_failed",
                                                                        "undo_failed")
    assert result["first_mismatch"] == 'refunded is true, expected "never"'
    assert result["verification"] == {"tool": "stripe.get_charge", "attempts": 3, "matched": False}
    assert upstream.count("charges.get") == 3


async def test_a_failed_undo_call_fails_the_step_with_the_upstreams_answer(
        upstream: UpstreamProc) -> None:
    result = await run(refund_step(upstream, "ch_missing"))
    assert (result["ok"], result["outcome"]) == (False, "undo_failed")
    assert result["reason"] == ('stripe.refund: the upstream answered 404: {"error": "no such '
                                'charge"}')
    assert result["call"] == {"status": 404, "kind": "error_status", "attempts": 1}
    assert upstream.count("charges.get") == 0  # no read-back after a failed call


async def test_the_step_key_goes_into_the_argument_carrier_the_undo_tool_declares(
        upstream: UpstreamProc) -> None:
    ch = charge(upstream)
    refund = tool("stripe.refund", "idempotent", upstream.url + "/charges/{{args.charge_id}}/refund",
                  idempotency={"key": "r-{{args.charge_id}}", "carrier": {"argument": "idem"}})
    assert (await run(refund_step(upstream, ch["id"], refund=refund)))["ok"]
    [req] = [r for r in upstream.admin("requests")["requests"] if r["route"] == "charges.refund"]
    assert req["arguments"] == {"idem": "unwind-compensate-0123"}  # charge_id is in the URL
    assert req["idempotency_key"] is None


async def test_a_lookup_that_finds_the_effect_completes_the_entrys_handle(
        upstream: UpstreamProc) -> None:
    ch = charge(upstream, "o7")
    result = await run(lookup_step(upstream, "charge-o7"))
    assert (result["ok"], result["outcome"], result["entry_state"]) == (True, "found", "succeeded")
    assert result["handle"] == {"args": {}, "result": {"id": ch["id"]}}


async def test_a_lookup_answering_404_means_the_call_never_happened_and_the_step_succeeds(
        upstream: UpstreamProc) -> None:
    result = await run(lookup_step(upstream, "charge-never"))
    assert (result["ok"], result["outcome"], result["entry_state"]) == (True, "not_found", "failed")


async def test_a_lookup_answering_anything_else_fails_and_the_entry_stays_uncertain(
        upstream: UpstreamProc) -> None:
    upstream.behave("charges.get", "fail", status=503)
    result = await run(lookup_step(upstream, "charge-o1"))
    assert (result["ok"], result["outcome"], result["entry_state"]) == (False, "lookup_failed",
                                                                        "uncertain")
    assert "answered 503" in result["reason"]


def test_the_result_always_fits_a_termination_message() -> None:
    big = {"ok": True, "outcome": "found", "entry_state": "succeeded", "ledger": "r",
           "entry": "e", "action": "lookup", "tool": "t", "reason": "x" * 5000,
           "first_mismatch": None, "handle": {"args": {}, "result": {"blob": "y" * 5000}}}
    line = fit(big)
    result = json.loads(line)
    assert len(line.encode()) <= MESSAGE_LIMIT
    assert (result["ok"], result["outcome"], result["entry_state"]) == (False, "lookup_failed",
                                                                        "uncertain")
    assert "larger than a termination message" in result["reason"]


def test_an_undo_step_given_a_traceparent_continues_that_trace_at_the_otlp_receiver(
        upstream: UpstreamProc, tmp_path: Path) -> None:
    from gateway.otlp_receiver import Receiver

    trace, parent = "6bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    ch = charge(upstream, "o-traced")
    receiver = Receiver()
    try:
        done = undo_step(UNWIND_STEP=json.dumps(refund_step(upstream, ch["id"])),
                         UNWIND_TERMINATION_LOG=str(tmp_path / "log"),
                         TRACEPARENT=f"00-{trace}-{parent}-01",
                         OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
        assert done.returncode == 0, done.stderr
        [step] = receiver.wait(lambda s: s.name == "undo_step stripe.refund")
        assert (step.trace_id, step.parent_id) == (trace, parent)
        assert step.service == "unwind-undo-step"
        assert step.attributes["unwind.entry.id"] == "pay-1"
        assert step.attributes["unwind.undo.action"] == "compensate"
        calls = receiver.wait(lambda s: s.parent_id == step.span_id and s.kind == "CLIENT"
                              and len([c for c in receiver.spans if c.parent_id == step.span_id]) >= 2)
        assert {c.name for c in calls} >= {"POST stripe.refund", "GET stripe.get_charge"}
    finally:
        receiver.close()


def test_an_undo_step_without_a_traceparent_sends_no_spans(upstream: UpstreamProc,
                                                           tmp_path: Path) -> None:
    from gateway.otlp_receiver import Receiver

    ch = charge(upstream, "o-untraced")
    receiver = Receiver()
    try:
        done = undo_step(UNWIND_STEP=json.dumps(refund_step(upstream, ch["id"])),
                         UNWIND_TERMINATION_LOG=str(tmp_path / "log"),
                         OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint)
        assert done.returncode == 0, done.stderr
        assert receiver.spans == []  # the process has exited: whatever it exported is here
    finally:
        receiver.close()
