"""Verifying that something is gone (``verification.absent``) and accepting "already undone"
(``compensation.done_statuses``): the read-back rule, one step against the test upstream,
and the local rollback of the example manifests run twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest

from unwind.ledger.undo import absence_problem
from unwind.manifest.model import Absent

from .conftest import GatewayProc, UpstreamProc, unwind
from .test_local_rollback import COMMENT, entries, ledger, since
from .test_undo_step import run, tool

DEFAULT = Absent()
FOUND_FALSE = Absent(statuses=[404], shape={"found": False})


@pytest.mark.parametrize(("absent", "status", "answer", "gone"), [
    (DEFAULT, 404, {"error": "no such comment"}, True),
    (DEFAULT, 410, None, True),
    (DEFAULT, 200, [], True),
    (DEFAULT, 200, {"id": 1}, False),
    (DEFAULT, 200, [{"id": 1}], False),
    (DEFAULT, 204, None, False),
    (DEFAULT, 403, {"error": "forbidden"}, False),
    (DEFAULT, 500, {"error": "down"}, False),
    (FOUND_FALSE, 200, {"found": False}, True),
    (FOUND_FALSE, 200, {"found": True, "id": 1}, False),
    (FOUND_FALSE, 410, None, False),
])
def test_a_read_back_proves_absence_by_a_listed_status_an_empty_list_or_the_declared_shape(
        absent: Absent, status: int, answer: Any, gone: bool) -> None:
    assert (absence_problem(absent, status, answer) is None) == gone


def test_a_read_back_that_still_finds_the_thing_says_so() -> None:
    assert absence_problem(DEFAULT, 200, {"id": 1}) == (
        "it is still there: the read-back answered 200 with something, not 404, 410 or an "
        "empty list")
    assert absence_problem(FOUND_FALSE, 200, {"found": True}) == (
        "it is still there: the read-back answered 200 and found is true, expected false "
        "(absent.shape)")
    assert absence_problem(DEFAULT, 500, None) == (
        "the read-back answered 500, which is not a status absent lists (404, 410)")


def comment(upstream: UpstreamProc) -> int:
    made = httpx2.post(f"{upstream.url}/comments", json={"repo": "octo/hello", "body": "hi"},
                       timeout=5)
    return int(made.json()["id"])


def delete_step(upstream: UpstreamProc, comment_id: int, *,
                done_statuses: list[int] | None = None) -> dict[str, Any]:
    u = upstream.url
    verification: dict[str, Any] = {
        "manifest": tool("github.get_comment", "read_only", u + "/comments/{{args.comment_id}}",
                         "GET"),
        "arguments": {"comment_id": comment_id}, "absent": {"statuses": [404, 410]},
        "retries": 2, "backoff_ms": 10}
    if done_statuses is not None:
        verification["done_statuses"] = done_statuses
    return {
        "version": 1, "ledger": "run-1",
        "step": {"entry": "c-1", "tool": "github.create_comment", "action": "inverse",
                 "undo_tool": "github.delete_comment", "arguments": {"comment_id": comment_id},
                 "residue": [], "requires_approval": False, "reason": "test"},
        "idempotency_key": "unwind-inverse-0123",
        "manifest": tool("github.delete_comment", "idempotent",
                         u + "/comments/{{args.comment_id}}", "DELETE"),
        "verification": verification, "timeout_ms": None, "effect": None}


async def test_a_created_records_delete_is_verified_absent_by_the_read_backs_404(
        upstream: UpstreamProc) -> None:
    result = await run(delete_step(upstream, comment(upstream), done_statuses=[404]))
    assert (result["ok"], result["outcome"], result["entry_state"]) == (True, "undone", "undone")
    assert result["call"] == {"status": 204, "kind": "ok", "attempts": 1}
    assert result["verification"] == {"tool": "github.get_comment", "attempts": 1,
                                      "matched": True}
    assert "confirmed it gone" in result["reason"]


async def test_a_delete_answering_404_with_absence_confirmed_is_done(
        upstream: UpstreamProc) -> None:
    gone = comment(upstream)
    assert httpx2.delete(f"{upstream.url}/comments/{gone}", timeout=5).status_code == 204
    result = await run(delete_step(upstream, gone, done_statuses=[404]))
    assert (result["ok"], result["outcome"], result["entry_state"]) == (True, "undone", "undone")
    assert result["call"]["status"] == 404
    assert result["reason"].startswith("github.delete_comment answered 404, a status "
                                       "compensation.done_statuses counts as done")


async def test_a_delete_answering_404_while_the_record_is_still_there_is_undo_failed(
        upstream: UpstreamProc) -> None:
    still = comment(upstream)
    upstream.behave("comments.delete", "fail", status=404)  # a wrong route, say
    result = await run(delete_step(upstream, still, done_statuses=[404]))
    assert (result["ok"], result["outcome"], result["entry_state"]) == (False, "undo_failed",
                                                                        "undo_failed")
    assert result["first_mismatch"].startswith("it is still there: the read-back answered 200")
    assert result["verification"] == {"tool": "github.get_comment", "attempts": 2,
                                      "matched": False}


async def test_a_delete_answering_404_is_a_failure_unless_the_manifest_lists_it(
        upstream: UpstreamProc) -> None:
    gone = comment(upstream)
    httpx2.delete(f"{upstream.url}/comments/{gone}", timeout=5)
    result = await run(delete_step(upstream, gone))
    assert (result["ok"], result["outcome"]) == (False, "undo_failed")
    assert result["verification"] is None  # no read-back after a failed call
    assert upstream.count("comments.get") == 0


def test_a_rolled_back_comment_is_read_back_absent_and_a_second_rollback_changes_nothing(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    made = gateway.call("github.create_comment", COMMENT, run=run_name, key="c-1")
    assert made.status_code == 200
    comment_id = made.json()["id"]
    before = len(upstream.admin("requests")["requests"])
    first = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
    assert first.code == 0, first.err
    listing = since(upstream, before)
    assert listing["by_route"] == {"comments.delete": 1, "comments.get": 1}
    assert httpx2.get(f"{upstream.url}/comments/{comment_id}", timeout=5).status_code == 404
    entry = entries(gateway, run_name)["c-1"]
    assert entry["state"] == "undone"
    assert entry["undo"]["verification"] == {"tool": "github.get_comment", "attempts": 1,
                                             "matched": True}
    page = ledger(gateway, run_name).read_text()

    before = len(upstream.admin("requests")["requests"])
    second = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
    assert second.code == 0, second.err
    assert since(upstream, before)["by_route"] == {}  # nothing called
    assert ledger(gateway, run_name).read_text() == page  # nothing written


def test_a_comment_deleted_by_someone_else_rolls_back_as_already_undone(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    made = gateway.call("github.create_comment", COMMENT, run=run_name, key="c-1")
    gone = httpx2.delete(f"{upstream.url}/comments/{made.json()['id']}", timeout=5)
    assert gone.status_code == 204
    ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
    assert ran.code == 0, ran.err + ran.out
    entry = entries(gateway, run_name)["c-1"]
    assert (entry["state"], entry["undo"]["outcome"]) == ("undone", "undone")
    assert entry["undo"]["call"]["status"] == 404
