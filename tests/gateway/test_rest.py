"""POST /call/<tool> in local mode: answers, reports, the ledger file, and every refusal code."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from .conftest import GatewayProc, UpstreamProc, start_gateway, stop

COMMENT = {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "looks good"}


def report(response: httpx2.Response) -> dict[str, Any]:
    return dict(json.loads(response.headers["X-Unwind-Effect"]))


def error(response: httpx2.Response) -> dict[str, Any]:
    return dict(response.json()["error"])


def test_a_call_returns_the_answer_and_the_report_and_the_ledger_holds_the_handle(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    r = gateway.call("github.create_comment", COMMENT, run=run_name, key="k-1")
    assert r.status_code == 200
    comment_id = r.json()["id"]
    assert r.json()["body"] == "looks good"
    assert report(r) == {
        "class": "reversible", "tool": "github.create_comment",
        "idempotency_key": f"{run_name}:comment-octo/hello-7-c1",  # scope run: the run is in it
        "undo": {"kind": "inverse", "tool": "github.delete_comment",
                 "arguments": {"repo": "octo/hello", "comment_id": comment_id}},
        "undo_unavailable": None, "deadline_ms": 86_400_000, "lookup": None,
        "ledger": {"name": run_name, "entry": "k-1"}, "staged": None, "warnings": []}
    [entry] = gateway.entries(run_name)
    assert entry["id"] == "k-1" and entry["seq"] == 1 and entry["state"] == "succeeded"
    assert entry["handle"] == {"args": {"repo": "octo/hello"}, "result": {"id": comment_id}}
    assert "looks good" not in json.dumps(entry)  # arguments are never stored whole
    assert entry["times"]["requested"] <= entry["times"]["started"] <= entry["times"]["finished"]
    assert entry["key"] == "comment-octo/hello-7-c1"
    assert entry["key_sent"] == f"{run_name}:comment-octo/hello-7-c1"
    assert upstream.admin("requests")["requests"][0]["idempotency_key"] == entry["key_sent"]
    got = httpx2.get(f"{gateway.url}/calls/{run_name}/k-1")
    assert got.status_code == 200 and got.json()["state"] == "succeeded"
    assert httpx2.get(f"{gateway.url}/calls/{run_name}/nope").status_code == 404


def test_the_entry_is_pending_in_the_ledger_file_when_the_upstream_receives_the_call(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    upstream.admin("watch", {"ledger_dir": str(gateway.ledger)})
    assert gateway.call("github.create_issue", {"repo": "octo/hello", "title": "flaky"},
                        run=run_name, key="wa-1").status_code == 200
    [seen] = upstream.admin("requests")["requests"]
    mine = [e for e in seen["ledger"] if e["ledger"] == f"{run_name}.json"]
    assert mine == [{"ledger": f"{run_name}.json", "id": "wa-1", "tool": "github.create_issue",
                     "state": "pending"}]
    assert gateway.entries(run_name)[0]["state"] == "succeeded"


def test_an_unwritable_ledger_answers_503_and_the_upstream_is_never_called(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    (gateway.ledger / f"{run_name}.json").mkdir()  # the page cannot be read or replaced
    r = gateway.call("github.create_issue", {"repo": "octo/hello", "title": "x"}, run=run_name)
    assert r.status_code == 503 and error(r)["code"] == "ledger_unavailable"
    assert "nothing is called" in error(r)["message"]
    assert upstream.count() == 0


def test_a_repeated_key_is_a_duplicate_naming_the_entry_that_holds_it(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    assert gateway.call("github.create_comment", COMMENT, run=run_name, key="a").status_code == 200
    again = gateway.call("github.create_comment", COMMENT, run=run_name, key="b")
    assert again.status_code == 409 and error(again)["code"] == "duplicate"
    assert error(again)["entry"] == "a"
    same_id = gateway.call("github.create_comment", COMMENT, run=run_name, key="a")
    assert same_id.status_code == 409 and error(same_id)["entry"] == "a"
    assert upstream.count() == 1
    states = [(e["id"], e["state"]) for e in gateway.entries(run_name)]
    assert states[0] == ("a", "succeeded") and states[1] == ("b", "refused")
    assert [e["error"]["code"] for e in gateway.entries(run_name)[1:]] == ["duplicate", "duplicate"]


@pytest.mark.parametrize(("status", "answer", "code"), [
    (409, 409, "upstream_conflict"), (412, 409, "upstream_conflict"),
    (400, 422, "upstream_rejected"), (422, 422, "upstream_rejected"),
    (500, 502, "upstream_error"), (404, 502, "upstream_error")])
def test_an_upstream_conflict_or_refusal_reaches_the_caller_as_a_4xx_it_does_not_retry(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str, status: int, answer: int,
        code: str) -> None:
    upstream.behave("comments.create", "fail", status=status)
    r = gateway.call("github.create_comment", COMMENT, run=run_name)
    assert r.status_code == answer and error(r)["code"] == code, r.text
    assert error(r)["upstream_status"] == status
    assert gateway.entries(run_name)[0]["state"] == ("uncertain" if status >= 500 else "failed")


def test_a_failed_call_frees_its_key_and_its_idempotency_key_may_be_used_again(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    upstream.behave("comments.create", "fail", status=422)
    failed = gateway.call("github.create_comment", COMMENT, run=run_name, key="f")
    assert failed.status_code == 422 and error(failed)["upstream_status"] == 422
    assert error(failed)["code"] == "upstream_rejected"  # not a 5xx a client would retry
    assert gateway.entries(run_name)[0]["state"] == "failed"
    upstream.behave("comments.create", "ok")
    again = gateway.call("github.create_comment", COMMENT, run=run_name, key="f")
    assert again.status_code == 200
    [entry] = gateway.entries(run_name)
    assert entry["state"] == "succeeded" and entry["attempts"][0]["state"] == "failed"


def test_an_upstream_that_hangs_gives_504_and_an_uncertain_entry_that_keeps_its_key(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    upstream.behave("comments.create", "hang")
    r = gateway.call("github.create_comment", COMMENT, run=run_name, key="h")
    assert r.status_code == 504 and error(r)["code"] == "upstream_timeout"
    assert report(r)["undo"] is None and "answer was lost" in report(r)["undo_unavailable"]
    assert gateway.entries(run_name)[0]["state"] == "uncertain"
    upstream.behave("comments.create", "ok")
    again = gateway.call("github.create_comment", COMMENT, run=run_name, key="h2")
    assert again.status_code == 409 and error(again)["entry"] == "h"


def test_an_answer_lost_after_the_effect_or_not_json_leaves_the_entry_uncertain(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    upstream.behave("issues.create", "drop")
    lost = gateway.call("github.create_issue", {"repo": "o/r", "title": "a"}, run=run_name, key="d")
    assert lost.status_code == 502 and error(lost)["code"] == "upstream_error"
    upstream.behave("issues.create", "not_json")
    text = gateway.call("github.create_issue", {"repo": "o/r", "title": "b"}, run=run_name, key="n")
    assert text.status_code == 502 and "not JSON" in error(text)["message"]
    assert [e["state"] for e in gateway.entries(run_name)] == ["uncertain", "uncertain"]


def test_malformed_requests_get_their_codes(gateway: GatewayProc, upstream: UpstreamProc,
                                            run_name: str) -> None:
    cases = [
        (gateway.call("github.create_issue", raw=b"{not json", run=run_name), 400, "not JSON"),
        (gateway.call("github.create_issue", raw=b"[1, 2]", run=run_name), 400, "JSON object"),
        (gateway.call("github.create_issue", raw=b'{"arguments": 3}', run=run_name), 400,
         "arguments must be"),
        (gateway.call("github.create_issue", raw=b'{"argumnts": {}}', run=run_name), 400,
         "unknown field 'argumnts'"),
        (gateway.call("github.create_issue", raw=b'{"stage": "yes"}', run=run_name), 400,
         "stage must be"),
        (gateway.call("github.create_issue", raw=b'{"arguments": {"x": NaN}}', run=run_name), 400,
         "not JSON"),
        (gateway.call("github.create_issue", raw=b'{"arguments": {"x": "'
                      + b"y" * 70_000 + b'"}}', run=run_name), 413, "larger than 64 KiB"),
        (gateway.call("github.create_issue", {}, run=run_name, key="bad key!"), 400,
         "Idempotency-Key must be"),
        # test.charge has no input_schema: its key, not the door's schema check, refuses these
        (gateway.call("test.charge", {"amount": 1}, run=run_name), 400,
         "needs {{args.order_id}}"),
        (gateway.call("test.charge", {"order_id": {"n": 1}}, run=run_name), 400,
         "to be a string, number or bool"),
        (gateway.call("github.nope", {}, run=run_name), 404, "is not served here"),
        (gateway.call("github.create_coment", {}, run=run_name), 404,
         "is not served here (did you mean github.create_comment?)"),
        (gateway.call("test.draft_only", {}, run=run_name), 404, "is only a draft"),
        (gateway.call("test.admin_read", {}, run=run_name), 403, "needs permission test:admin"),
        (gateway.call("test.needs_comment", {}, run=run_name), 409,
         "requires github.create_comment"),
        (gateway.call("github.publish_release", {"release_id": 1}, run=run_name, stage=True), 422,
         "has no draft form"),
        (gateway.call("test.missing_secret", {}, run=run_name), 502, "UNWIND_SECRET_NOWHERE_TOKEN"),
    ]
    for response, status, text in cases:
        assert response.status_code == status, response.text
        assert text in error(response)["message"], response.text
    assert upstream.count() == 0
    entries = gateway.entries(run_name)
    assert len(entries) == len(cases)
    assert {e["state"] for e in entries} == {"refused"}
    assert [e["error"]["code"] for e in entries][-4:] == [
        "permission_denied", "requires_not_met", "unsupported_operation", "upstream_error"]


def test_a_request_that_names_no_run_is_refused_naming_the_header_and_not_recorded(
        gateway: GatewayProc) -> None:
    r = gateway.call("github.create_issue", {}, run=None)
    assert r.status_code == 400 and "X-Unwind-Run" in error(r)["message"]
    bad = gateway.call("github.create_issue", {}, run="Not A Run")
    assert bad.status_code == 400 and "X-Unwind-Run" in error(bad)["message"]
    assert not list(gateway.ledger.glob("*Not*"))


def test_requires_is_met_by_a_succeeded_call_earlier_in_the_run(
        gateway: GatewayProc, run_name: str) -> None:
    assert gateway.call("github.create_comment", COMMENT, run=run_name).status_code == 200
    assert gateway.call("test.needs_comment", {"title": "t"}, run=run_name).status_code == 200


def test_a_deprecated_tool_is_served_with_a_warning_naming_its_replacement(
        gateway: GatewayProc, run_name: str) -> None:
    created = gateway.call("github.create_issue", {"repo": "o/r", "title": "t"}, run=run_name)
    r = gateway.call("test.old_issue", {"number": created.json()["number"]}, run=run_name)
    assert r.status_code == 200
    assert report(r)["warnings"] == ["test.old_issue is deprecated: use github.get_issue"]


def test_staging_performs_the_draft_form_and_reports_how_to_promote_it(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    r = gateway.call("github.create_release", {"repo": "octo/hello", "tag": "v1", "name": "One"},
                     run=run_name, stage=True)
    assert r.status_code == 200 and r.json()["draft"] is True
    staged = report(r)["staged"]
    assert staged == {"draft_tool": "github.create_release",
                      "handle": {"repo": "octo/hello", "release_id": r.json()["id"]},
                      "promote": "github.publish_release", "discard": "github.delete_release"}
    assert report(r)["undo"] is None
    [entry] = gateway.entries(run_name)
    assert entry["state"] == "succeeded" and entry["staged"] == staged
    assert upstream.admin("requests")["requests"][0]["arguments"]["draft"] is True


def test_a_dry_run_reports_and_lists_the_refusals_and_writes_and_calls_nothing(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    ok = gateway.call("github.create_comment", COMMENT, run=run_name, dry_run=True)
    assert ok.status_code == 200
    assert ok.json()["would_run"] is True and ok.json()["refusals"] == []
    assert ok.json()["report"]["undo"] == {"kind": "inverse", "tool": "github.delete_comment",
                                           "arguments": {"repo": "octo/hello"}}
    charge = gateway.call("stripe.create_charge", {"order_id": "o9", "amount": 5}, run=run_name,
                          dry_run=True)
    assert [x["code"] for x in charge.json()["refusals"]] == ["approval_required"]
    assert upstream.count() == 0 and gateway.entries(run_name) == []


def test_redacted_values_are_masked_in_the_ledger_the_log_and_an_upstream_error_body(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    args = {"order_id": "r1", "amount": 300, "card_token": "tok_SECRET42"}
    upstream.behave("charges.create", "fail", status=400)
    r = gateway.call("test.charge", args, run=run_name, key="red-1")
    assert r.status_code == 422
    assert "tok_SECRET42" not in r.text and "[redacted]" in r.text
    upstream.behave("charges.create", "ok")
    ok = gateway.call("test.charge", args, run=run_name, key="red-2")
    assert ok.status_code == 200
    sent = upstream.admin("requests")["requests"][-1]["arguments"]
    assert sent["idempotency_key"] == "t-r1"  # the key rides in the argument the manifest names
    assert report(ok)["undo"] == {"kind": "compensate", "tool": "stripe.refund",
                                  "arguments": {"charge_id": ok.json()["id"], "amount": 300}}
    ledger_text = (gateway.ledger / f"{run_name}.json").read_text()
    assert "tok_SECRET42" not in ledger_text
    assert "tok_SECRET42" not in gateway.log.read_text()
    conflicting = gateway.call("test.charge", {**args, "order_id": "r2", "idempotency_key": "x"},
                               run=run_name)
    assert conflicting.status_code == 400 and "carries the idempotency key" in error(conflicting)["message"]


def test_header_values_come_from_secret_files(gateway: GatewayProc, upstream: UpstreamProc,
                                              run_name: str) -> None:
    # the release exists: the test upstream answers 404 for one that does not
    httpx2.post(f"{upstream.url}/releases", json={"repo": "o/r", "tag": "v9"}, timeout=5)
    assert gateway.call("test.with_secret", {"repo": "o/r", "tag": "v9"}, run=run_name).status_code == 200
    assert upstream.admin("requests")["requests"][-1]["authorization"] == "Bearer from-a-file"


def test_probes_and_metrics_answer(gateway: GatewayProc, run_name: str) -> None:
    gateway.call("github.create_issue", {"repo": "o/r", "title": "m"}, run=run_name)
    assert httpx2.get(f"{gateway.url}/healthz").json() == {"ok": True}
    ready = httpx2.get(f"{gateway.url}/readyz")
    assert ready.status_code == 200 and ready.json()["generation"].startswith("local-")
    metrics = httpx2.get(f"{gateway.url}/metrics").text
    assert 'unwind_gateway_calls_total{effect_class="compensable",outcome="succeeded",' \
           'tool="github.create_issue"}' in metrics
    assert "unwind_gateway_ledger_write_seconds_bucket" in metrics
    assert "unwind_gateway_catalogue_info{generation=" in metrics


def test_invalid_manifests_leave_the_gateway_unready_and_every_call_refused(
        tmp_path: Path, upstream: UpstreamProc) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- tool: a.b\n  effect: sometimes\n  permission: x\n")
    gw = start_gateway(bad, tmp_path / "ledger", tmp_path)
    try:
        ready = httpx2.get(f"{gw.url}/readyz")
        assert ready.status_code == 503 and "not valid" in ready.json()["problem"]
        r = gw.call("a.b", {})
        assert r.status_code == 404 and "serves no manifests" in error(r)["message"]
    finally:
        stop(gw.proc)
    assert "catalogue refused" in gw.log.read_text()


def test_only_read_only_and_idempotent_tools_are_retried(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    upstream.behave("charges.get", "fail", status=503)
    read = gateway.call("stripe.get_charge", {"charge_id": "ch_x"}, run=run_name)
    assert read.status_code == 502 and "after 3 attempts" in error(read)["message"]
    assert upstream.count("charges.get") == 3  # retry: {attempts: 3}
    upstream.behave("comments.create", "fail", status=503)
    once = gateway.call("github.create_comment", COMMENT, run=run_name)
    assert once.status_code == 502 and upstream.count("comments.create") == 1
    assert [e["state"] for e in gateway.entries(run_name)] == ["failed", "uncertain"]
