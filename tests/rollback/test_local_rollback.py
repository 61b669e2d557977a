"""The local story: calls through `unwind gateway`, then `unwind plan` and `unwind rollback`
on the run's ledger file, against the real test upstream."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unwind.ledger.store import lock_name

from .conftest import GatewayProc, UpstreamProc, unwind

CHARGE = {"order_id": "o1", "amount": 2500, "card_token": "tok_visa"}
COMMENT = {"repo": "octo/hello", "issue": 7, "client_id": "c1", "body": "looks good"}
ISSUE = {"repo": "octo/hello", "title": "flaky test"}
RELEASE = {"repo": "octo/hello", "tag": "v1.0.0", "name": "One"}


def ledger(gateway: GatewayProc, run: str) -> Path:
    return gateway.ledger / f"{run}.json"


def entries(gateway: GatewayProc, run: str) -> dict[str, dict[str, Any]]:
    return {e["id"]: e for e in gateway.entries(run)}


def approved_charge(gateway: GatewayProc, run: str, key: str, args: dict[str, Any]) -> Any:
    assert gateway.call("stripe.create_charge", args, run=run, key=key).status_code == 428
    for who in ("alice", "bob"):
        assert unwind("approve", "--ledger", ledger(gateway, run), "--entry", key, "--by", who,
                      "--group", "finance").code == 0
    return gateway.call("stripe.create_charge", args, run=run, key=key)


def OBJ(**values: Any) -> str:
    """The plan's object key: the read-back's arguments, values as text (ledger/objects.py)."""
    return json.dumps({k: str(v) for k, v in values.items()}, sort_keys=True,
                      separators=(",", ":"))


def since(upstream: UpstreamProc, before: int) -> dict[str, Any]:
    """The requests the upstream got after the first ``before``, and their count by route."""
    requests = upstream.admin("requests")["requests"][before:]
    by_route: dict[str, int] = {}
    for r in requests:
        by_route[r["route"]] = by_route.get(r["route"], 0) + 1
    return {"requests": requests, "by_route": by_route}


def steps(gateway: GatewayProc, run: str, manifests: Path, *extra: str) -> list[tuple[str, str]]:
    ran = unwind("plan", "--ledger", ledger(gateway, run), "-m", manifests, "--json", *extra)
    assert ran.code == 0, ran.err
    return [(s["entry"], s["action"]) for s in ran.json()["steps"]]


def test_a_run_of_a_charge_a_comment_an_issue_and_a_staged_release_is_planned_and_rolled_back(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    charge = approved_charge(gateway, run_name, "pay-1", CHARGE)
    assert charge.status_code == 200
    comment = gateway.call("github.create_comment", COMMENT, run=run_name, key="c-1")
    issue = gateway.call("github.create_issue", ISSUE, run=run_name, key="i-1")
    release = gateway.call("github.create_release", RELEASE, run=run_name, key="rel-1", stage=True)
    assert [r.status_code for r in (comment, issue, release)] == [200, 200, 200]

    plan = unwind("plan", "--ledger", ledger(gateway, run_name), "-m", manifests, "--json")
    assert plan.code == 0, plan.err
    assert plan.json() == {"ledger": run_name, "steps": [
        {"entry": "rel-1", "tool": "github.create_release", "action": "discard",
         "undo_tool": "github.delete_release",
         "arguments": {"repo": "octo/hello", "release_id": release.json()["id"]}, "residue": [],
         "requires_approval": False,
         "reason": "a staged draft (never promoted): github.delete_release throws it away",
         "object": None, "headers": {},
         "read_before": None},
        {"entry": "i-1", "tool": "github.create_issue", "action": "compensate",
         "undo_tool": "github.close_issue",
         "arguments": {"repo": "octo/hello", "number": issue.json()["number"],
                       "reason": "not_planned"},
         "residue": ["the issue number stays taken and the issue can still be read, closed",
                     "watchers were already notified"], "requires_approval": False,
         "reason": "compensable: github.close_issue makes amends, read back with "
                   "github.get_issue; it leaves residue",
         "object": OBJ(number=issue.json()["number"], repo="octo/hello"), "headers": {},
         "read_before": None},
        {"entry": "c-1", "tool": "github.create_comment", "action": "inverse",
         "undo_tool": "github.delete_comment",
         "arguments": {"repo": "octo/hello", "comment_id": comment.json()["id"]}, "residue": [],
         "requires_approval": False,
         "reason": plan.json()["steps"][2]["reason"],
         "object": OBJ(comment_id=comment.json()["id"], repo="octo/hello"), "headers": {},
         "read_before": None},
        {"entry": "pay-1", "tool": "stripe.create_charge", "action": "compensate",
         "undo_tool": "stripe.refund", "arguments": {"charge_id": charge.json()["id"], "amount": 2500},
         "residue": ["the charge still appears on the customer's statement"],
         "requires_approval": False,
         "reason": "compensable: stripe.refund makes amends, read back with stripe.get_charge; "
                   "it leaves residue",
         "object": OBJ(charge_id=charge.json()["id"]), "headers": {}, "read_before": None}]}
    assert plan.json()["steps"][2]["reason"].startswith(
        "reversible: the inverse github.delete_comment restores the prior state (possible until ")

    text = unwind("plan", "--ledger", ledger(gateway, run_name), "-m", manifests)
    assert text.code == 0
    assert "ENTRY  TOOL" in text.out and "UNDO TOOL" in text.out
    assert "residue: the charge still appears on the customer's statement" in text.out
    assert text.out.rstrip().endswith("4 of 4 steps run; left behind: 2 with residue, "
                                      "0 not undoable, 0 unrecoverable")

    before = len(upstream.admin("requests")["requests"])
    ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
    assert ran.code == 0, ran.err
    assert "rolled back: 4 steps ran" in ran.out
    listing = since(upstream, before)
    assert listing["by_route"] == {"releases.delete": 1, "issues.close": 1, "issues.get": 1,
                                   "comments.delete": 1, "comments.get": 1,
                                   "charges.refund": 1, "charges.get": 1}
    undos = [r for r in listing["requests"] if r["route"] in
             ("releases.delete", "issues.close", "comments.delete", "charges.refund")]
    assert [r["route"] for r in undos] == ["releases.delete", "issues.close", "comments.delete",
                                           "charges.refund"]
    assert all(r["idempotency_key"].startswith("unwind-") for r in undos)
    assert len({r["idempotency_key"] for r in undos}) == 4

    after = entries(gateway, run_name)
    assert {k: e["state"] for k, e in after.items()} == {
        "pay-1": "undone", "c-1": "undone", "i-1": "undone", "rel-1": "undone"}
    undo = after["c-1"]["undo"]
    assert (undo["action"], undo["tool"], undo["outcome"]) == ("inverse", "github.delete_comment",
                                                               "undone")
    assert undo["verification"] == {"tool": "github.get_comment", "attempts": 1, "matched": True}
    assert undo["idempotency_key"] == undos[2]["idempotency_key"]

    # The comment's key is free again: its lock file is gone. The run itself stays closed to
    # new calls (the rollback fenced it): the same comment there is refused, naming the rollback.
    name = lock_name("run", run=run_name, actor="agent", tool="github.create_comment",
                     key="comment-octo/hello-7-c1")
    assert not (gateway.ledger / ".locks" / f"{name}.key").exists()
    again = gateway.call("github.create_comment", COMMENT, run=run_name, key="c-2")
    assert again.status_code == 409 and again.json()["error"]["code"] == "rolled_back"
    assert f"run {run_name} is being rolled back" in again.json()["error"]["message"]

    frozen = json.loads((gateway.ledger / f"{run_name}.rollback.json").read_text())
    assert frozen["rollbacks"][0]["plan"] == plan.json() and frozen["rollbacks"][0]["ok"] is True

    before = len(upstream.admin("requests")["requests"])
    again = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes",
                   "--entry", "pay-1", "c-1", "i-1", "rel-1")
    assert again.code == 0 and "nothing to run" in again.out
    assert since(upstream, before)["requests"] == []


def test_a_failed_read_back_leaves_the_entry_undo_failed_with_the_first_mismatch_and_stops(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    assert gateway.call("github.create_comment", COMMENT, run=run_name, key="c-1").status_code == 200
    assert gateway.call("test.issue_checked_wrongly", ISSUE, run=run_name,
                        key="w-1").status_code == 200
    ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
    assert ran.code == 1
    assert "stopped at entry w-1" in ran.err
    assert ran.err.count('state is "closed", expected "completed"') == 1, ran.err  # said once
    after = entries(gateway, run_name)
    assert after["w-1"]["state"] == "undo_failed"
    assert after["w-1"]["undo"]["first_mismatch"] == 'state is "closed", expected "completed"'
    assert after["w-1"]["undo"]["verification"] == {"tool": "github.get_issue", "attempts": 2,
                                                    "matched": False}
    assert after["c-1"]["state"] == "succeeded"  # after the failure nothing else ran
    assert upstream.count("comments.delete") == 0


def test_an_unrecoverable_entry_is_reported_and_the_rest_is_rolled_back(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    assert gateway.call("test.issue_without_number", ISSUE, run=run_name,
                        key="n-1").status_code == 200
    assert gateway.call("github.create_comment", COMMENT, run=run_name, key="c-1").status_code == 200
    plan = unwind("plan", "--ledger", ledger(gateway, run_name), "-m", manifests, "--json").json()
    assert plan["steps"][1] == {
        "entry": "n-1", "tool": "test.issue_without_number", "action": "unrecoverable",
        "undo_tool": None, "arguments": None, "residue": [], "requires_approval": False,
        "reason": "the undo is unavailable: number: $result has no 'url'", "object": None, "headers": {}, "read_before": None}
    ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
    assert ran.code == 0, ran.err
    assert "left behind: n-1 (unrecoverable)" in ran.out
    after = entries(gateway, run_name)
    assert (after["c-1"]["state"], after["n-1"]["state"]) == ("undone", "succeeded")
    assert upstream.count("issues.close") == 0


def test_since_a_checkpoint_only_what_came_after_it_is_undone(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    first = gateway.call("github.create_comment", COMMENT, run=run_name, key="c-1")
    assert gateway.call("github.get_comment", {"comment_id": first.json()["id"]}, run=run_name,
                        key="mark").status_code == 200
    assert gateway.call("github.create_issue", ISSUE, run=run_name, key="i-1").status_code == 200
    later = {**COMMENT, "client_id": "c2"}
    assert gateway.call("github.create_comment", later, run=run_name, key="c-2").status_code == 200
    assert steps(gateway, run_name, manifests, "--since", "mark") == [("c-2", "inverse"),
                                                                       ("i-1", "compensate")]
    ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes",
                 "--since", "mark")
    assert ran.code == 0, ran.err
    after = entries(gateway, run_name)
    assert {k: e["state"] for k, e in after.items()} == {
        "c-1": "succeeded", "mark": "succeeded", "i-1": "undone", "c-2": "undone"}


def test_a_lost_answer_is_found_by_its_lookup_and_rolled_back_like_any_other(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    upstream.behave("charges.create", "drop")
    lost = approved_charge(gateway, run_name, "pay-1", CHARGE)
    assert lost.status_code == 502
    upstream.behave("charges.create", "ok")
    assert entries(gateway, run_name)["pay-1"]["state"] == "uncertain"
    assert steps(gateway, run_name, manifests) == [("pay-1", "lookup")]

    ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
    assert ran.code == 0, ran.err
    assert "pay-1 lookup stripe.get_charge: found" in ran.out
    assert "pay-1 compensate stripe.refund: undone" in ran.out
    requests = upstream.admin("requests")["requests"]
    [charge] = [r for r in requests if r["route"] == "charges.create"]
    assert next(r for r in requests if r["route"] == "charges.get")["arguments"] == {
        "idempotency_key": "charge-o1"}  # the lookup, by the key that went upstream
    [refund] = [r for r in requests if r["route"] == "charges.refund"]
    assert charge["idempotency_key"] == "charge-o1"
    entry = entries(gateway, run_name)["pay-1"]
    assert entry["state"] == "undone" and entry["undo"]["lookup"]["outcome"] == "found"
    assert refund["path"] == f"/charges/{entry['handle']['result']['id']}/refund"
    assert upstream.admin("requests")["effects_by_route"]["charges.refund"] == 1


def test_a_lookup_that_finds_nothing_marks_the_entry_failed_and_frees_its_key(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    upstream.behave("charges.create", "hang")
    lost = approved_charge(gateway, run_name, "pay-1", {**CHARGE, "order_id": "o-never"})
    assert lost.status_code == 504
    upstream.admin("reset", {})  # the hung request never created the charge
    ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
    assert ran.code == 0, ran.err
    entry = entries(gateway, run_name)["pay-1"]
    assert entry["state"] == "failed" and entry["undo"]["lookup"]["outcome"] == "not_found"
    assert upstream.count("charges.refund") == 0
    name = lock_name("global", run=run_name, actor="agent", tool="stripe.create_charge",
                     key="charge-o-never")
    assert not (gateway.ledger / ".locks" / f"{name}.key").exists()


def test_a_rollback_not_confirmed_runs_nothing_and_confirming_approves_its_steps(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str) -> None:
    assert gateway.call("test.issue_closed_with_approval", ISSUE, run=run_name,
                        key="a-1").status_code == 200
    text = unwind("plan", "--ledger", ledger(gateway, run_name), "-m", manifests)
    assert "needed" in text.out and "1 of 1 step run, 1 need approval" in text.out
    refused = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests)
    assert refused.code == 1 and "not confirmed" in refused.err
    assert entries(gateway, run_name)["a-1"]["state"] == "succeeded"
    assert upstream.count("issues.close") == 0
    ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes",
                 "--by", "carol")
    assert ran.code == 0, ran.err
    undo = entries(gateway, run_name)["a-1"]["undo"]
    assert undo["by"] == "carol"
    assert undo["approved_by"] == {"user": "carol", "identities": "self-declared"}


def test_a_ledger_file_that_is_not_there_is_named_with_where_ledger_files_come_from(
        manifests: Path, tmp_path: Path) -> None:
    for command in (["plan"], ["rollback", "--yes"]):
        ran = unwind(*command, "--ledger", tmp_path / "demo.json", "-m", manifests)
        assert ran.code == 1
        assert f"{tmp_path / 'demo.json'}: no such ledger file" in ran.err
        assert "--ledger-dir" in ran.err and "kubectl get effectledger NAME -o json" in ran.err


def test_a_ci_job_reusing_its_run_name_with_a_fresh_ledger_sends_a_new_undo_key(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str,
        tmp_path: Path) -> None:
    keys = []
    for job in (1, 2):
        comment = {**COMMENT, "client_id": f"ci-{job}"}
        assert gateway.call("github.create_comment", comment, run=run_name, key="c-1").status_code == 200
        before = len(upstream.admin("requests")["requests"])
        ran = unwind("rollback", "--ledger", ledger(gateway, run_name), "-m", manifests, "--yes")
        assert ran.code == 0, ran.err
        [delete] = [r for r in since(upstream, before)["requests"] if r["route"] == "comments.delete"]
        keys.append(delete["idempotency_key"])
        assert entries(gateway, run_name)["c-1"]["undo"]["idempotency_key"] == keys[-1]
        # The job ends; the next one starts with a fresh ledger of the same run name.
        for name in (f"{run_name}.json", f"{run_name}.rollback.json"):
            (gateway.ledger / name).rename(tmp_path / f"job{job}-{name}")
    assert keys[0] != keys[1]
    assert all(k.startswith("unwind-inverse-") for k in keys)


def test_a_ledger_file_without_a_uid_keys_its_undos_by_its_first_entry() -> None:
    from unwind.ledger.entry import Entry, Times
    from unwind.ledger.stepinput import ledger_identity

    def first(requested: str) -> Entry:
        return Entry(id="c-1", seq=1, tool="t", actor="a", state="succeeded",
                     times=Times(requested=requested))

    one = ledger_identity(None, None, [first("2026-12-01T10:00:00.000Z")])
    two = ledger_identity(None, None, [first("2026-12-02T10:00:00.000Z")])
    assert one.startswith("first:") and one != two
    assert ledger_identity("ns", "u-1", []) == "uid:ns/u-1" != ledger_identity("ns", "u-2", [])
