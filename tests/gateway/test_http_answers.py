"""What the gateway makes of an HTTP upstream's answer and what it sends: a 2xx without a
body is a success (result null), and an argument that fills a URL placeholder goes out
once, in the URL, unless the manifest asks for it again."""

from __future__ import annotations

from typing import Any

from unwind.manifest.model import ToolManifest
from unwind.upstream.client import Upstream, prepare
from unwind.upstream.secrets import LocalSecrets

from .conftest import GatewayProc, UpstreamProc

COMMENT = {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "looks good"}


def manifest(url: str, method: str, **upstream: Any) -> ToolManifest:
    return ToolManifest.model_validate({
        "tool": "t.call", "effect": "idempotent", "permission": "p:w",
        "upstream": {"url": url, "method": method, **upstream}})


def test_a_delete_answering_204_no_content_is_a_success_with_a_null_result(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    made = gateway.call("github.create_comment", COMMENT, run=run_name, key="c-1")
    gone = gateway.call("github.delete_comment", {"repo": "octo/hello",
                                                  "comment_id": made.json()["id"]},
                        run=run_name, key="d-1")
    assert gone.status_code == 200, gone.text
    assert gone.json() is None
    states = {e["id"]: e["state"] for e in gateway.entries(run_name)}
    assert states == {"c-1": "succeeded", "d-1": "succeeded"}


def test_a_200_with_an_empty_body_is_a_success_not_a_lost_answer(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    upstream.behave("issues.create", "empty")
    r = gateway.call("github.create_issue", {"repo": "octo/hello", "title": "x"},
                     run=run_name, key="i-1")
    assert r.status_code == 200, r.text
    assert r.json() is None
    [entry] = gateway.entries(run_name)
    assert entry["state"] == "succeeded"  # not uncertain: the upstream said it was done


def test_a_body_that_is_not_json_is_still_a_lost_answer(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    upstream.behave("issues.create", "not_json")
    r = gateway.call("github.create_issue", {"repo": "octo/hello", "title": "x"},
                     run=run_name, key="i-1")
    assert r.status_code == 502
    assert gateway.entries(run_name)[0]["state"] == "uncertain"


def test_an_argument_that_fills_the_url_is_not_sent_again_in_the_query(
        gateway: GatewayProc, upstream: UpstreamProc, run_name: str) -> None:
    made = gateway.call("github.create_comment", COMMENT, run=run_name, key="c-1")
    comment_id = made.json()["id"]
    assert gateway.call("github.get_comment", {"repo": "octo/hello", "comment_id": comment_id},
                        run=run_name).status_code == 200
    [read] = [r for r in upstream.admin("requests")["requests"] if r["route"] == "comments.get"]
    assert read["path"] == f"/comments/{comment_id}"
    assert read["arguments"] == {"repo": "octo/hello"}  # comment_id only in the path


def test_placeholder_arguments_are_left_out_of_the_body_and_query_by_default() -> None:
    for method in ("GET", "DELETE", "POST", "PATCH"):
        p = prepare(manifest("http://up.invalid/items?id=eq.{{args.id}}", method),
                    {"id": 7, "name": "x"}, LocalSecrets(), {})
        assert p.url == "http://up.invalid/items?id=eq.7"
        assert p.arguments == {"name": "x"}, method


def test_send_placeholder_args_sends_them_in_the_body_or_query_too() -> None:
    p = prepare(manifest("http://up.invalid/items/{{args.id}}", "POST",
                         send_placeholder_args=True), {"id": 7, "name": "x"}, LocalSecrets(), {})
    assert p.url == "http://up.invalid/items/7"
    assert p.arguments == {"id": 7, "name": "x"}


async def test_a_filter_in_the_url_reaches_the_upstream_once(upstream: UpstreamProc) -> None:
    client = Upstream()
    try:
        p = prepare(manifest(upstream.url + "/charges?charge_id={{args.charge_id}}", "GET"),
                    {"charge_id": "ch_9"}, LocalSecrets(), {})
        answer = await client.send(p)
    finally:
        await client.aclose()
    assert (answer.kind, answer.status) == ("error_status", 404)  # no such charge, asked once
    [read] = upstream.admin("requests")["requests"]
    assert read["arguments"] == {"charge_id": "ch_9"}
    assert read["path"] == "/charges"


async def test_a_204_answer_of_a_direct_send_is_ok_with_no_data(upstream: UpstreamProc) -> None:
    client = Upstream()
    try:
        made = await client.send(prepare(manifest(upstream.url + "/comments", "POST"),
                                         {"body": "hi"}, LocalSecrets(), {}))
        gone = await client.send(prepare(
            manifest(upstream.url + "/comments/{{args.comment_id}}", "DELETE"),
            {"comment_id": made.data["id"]}, LocalSecrets(), {}))
    finally:
        await client.aclose()
    assert (gone.kind, gone.status, gone.data, gone.may_have_acted) == ("ok", 204, None, False)
