"""The pure parts of `kubectl unwind plan|rollback ledger/NAME`: the plan's manifests from
what the cluster records, the request, and what --watch prints and when it stops."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from unwind.cli import plugin_view as view
from unwind.cli.kubectl import hoist_kube_flags
from unwind.manifest.canonical import canonical_json, checksum
from unwind.undo.sources import load_versions

ROOT = Path(__file__).resolve().parents[2]


def revision(m: Any, claimed: str | None = None) -> dict[str, Any]:
    return {"metadata": {"annotations": {view.CHECKSUM_ANNOTATION: claimed or checksum(m)}},
            "data": json.loads(canonical_json(m.canonical_dict()))}


def test_the_plan_uses_every_recorded_version_by_checksum_and_the_published_one_as_today() -> None:
    loaded = load_versions([str(ROOT / "manifests/payments.yaml")])
    refund = loaded.tools["stripe.refund"]
    charge = loaded.tools["stripe.create_charge"]
    manifests = [{"status": {"publishedChecksum": checksum(refund)}}, {"status": {}}]
    versions = view.cluster_versions(manifests, [revision(refund), revision(charge)])
    assert set(versions.by_checksum) == {checksum(refund), checksum(charge)}
    assert list(versions.tools) == ["stripe.refund"]  # the charge publishes nothing


def test_a_revision_whose_data_does_not_match_its_checksum_is_not_used() -> None:
    refund = load_versions([str(ROOT / "manifests/payments.yaml")]).tools["stripe.refund"]
    versions = view.cluster_versions([], [revision(refund, "sha256:" + "0" * 64)])
    assert not versions.by_checksum


def test_a_rollback_request_is_a_new_request_each_time_it_is_made() -> None:
    patch = view.rollback_request("bad run", None, ["e-1"], "2026-11-30T10:00:00.000Z")
    assert patch == {"spec": {"rollback": {"requested": True, "reason": "bad run", "since": None,
                                           "entries": ["e-1"], "requestedAt": "2026-11-30T10:00:00.000Z"}}}


def test_watch_says_first_how_many_steps_were_planned_and_who_asked() -> None:
    rb = {"planned": "2026-11-30T10:00:00.000Z", "skipped": 1, "steps": [{"index": 1}, {"index": 2}],
          "requestedBy": {"user": "bob", "groups": ["sre"]}}
    assert view.planned_line(rb) == ("planned at 2026-11-30T10:00:00.000Z: 2 steps, 1 with nothing to undo; "
                                     "requested by bob")
    rb["requestedBy"] = {"problem": "no identity was recorded"}
    assert view.planned_line(rb).endswith("; requester unknown: no identity was recorded")
    assert view.planned_line({"error": "no version of x", "steps": []}) == "no plan: no version of x"


def test_watch_prints_each_step_once_per_state_it_reaches() -> None:
    seen: dict[int, str] = {}
    rb = {"steps": [{"index": 1, "entry": "c-1", "action": "inverse", "undo_tool": "github.delete_comment",
                     "state": "running", "job": "run-undo-1-ab"},
                    {"index": 2, "entry": "x-1", "action": "unrecoverable", "state": "left",
                     "message": "the undo is unavailable"}]}
    assert view.step_lines(seen, rb) == [
        "step 1/2 c-1 inverse github.delete_comment: running: Job run-undo-1-ab",
        "step 2/2 x-1 unrecoverable: left: the undo is unavailable"]
    assert view.step_lines(seen, rb) == []
    rb["steps"][0].update(state="failed", first_mismatch="found is true, expected false")
    assert view.step_lines(seen, rb) == [
        "step 1/2 c-1 inverse github.delete_comment: failed: found is true, expected false"]


def ledger(generation: int, finished: bool, **conds: tuple[str, str]) -> dict[str, Any]:
    rb: dict[str, Any] = {"generation": generation, "steps": []}
    if finished:
        rb["finished"] = "2026-11-30T10:00:00.000Z"
    return {"status": {"rollback": rb, "conditions": [
        {"type": t, "status": s, "reason": r, "message": f"{t} {r}", "observedGeneration": generation}
        for t, (s, r) in conds.items()]}}


def test_watch_stops_at_rolled_back_or_at_a_finished_degraded_rollback_of_its_request() -> None:
    assert view.rollback_done(ledger(2, False), 3) is None  # the operator has not frozen it yet
    assert view.rollback_done(ledger(3, False, RolledBack=("False", "InProgress")), 3) is None
    assert view.rollback_done(ledger(3, True, RolledBack=("True", "RolledBack")), 3) == (True, "RolledBack RolledBack")
    running = ledger(3, False, RolledBack=("False", "StepFailed"), Degraded=("True", "StepFailed"))
    assert view.rollback_done(running, 3) is None  # steps still running are recorded first
    done = view.rollback_done(ledger(3, True, RolledBack=("False", "StepFailed"), Degraded=("True", "StepFailed")), 3)
    assert done == (False, "Degraded: Degraded StepFailed")
    failed = view.rollback_done(ledger(3, True, RolledBack=("False", "PlanFailed")), 3)
    assert failed == (False, "PlanFailed: RolledBack PlanFailed")


def test_kubectl_flags_before_plan_and_rollback_are_moved_after_them() -> None:
    from unwind.cli.main import HOISTED

    assert hoist_kube_flags(["-n", "shop", "plan", "ledger/r"], HOISTED) == ["plan", "-n", "shop", "ledger/r"]
    assert hoist_kube_flags(["--context=c", "rollback", "ledger/r"], HOISTED) == ["rollback", "--context=c", "ledger/r"]


def test_watch_ends_with_the_operators_failure_on_the_ledger_instead_of_timing_out() -> None:
    # the plan could not be written: status.rollback never reaches the request's generation
    refused = ledger(2, True, RolledBack=("False", "StatusWriteFailed"), Degraded=("True", "StatusWriteFailed"))
    refused["status"]["conditions"][0]["observedGeneration"] = 3
    assert view.rollback_done(refused, 3) == (False, "StatusWriteFailed: RolledBack StatusWriteFailed")
    older = ledger(2, True, RolledBack=("False", "StatusWriteFailed"))  # about an earlier request
    assert view.rollback_done(older, 3) is None


def test_a_partial_rollback_ends_the_watch_saying_partly_and_exits_zero() -> None:
    partial = ledger(3, True, RolledBack=("False", "PartiallyRolledBack"), Degraded=("False", "NoFailures"))
    done = view.rollback_done(partial, 3)
    assert done == (True, "PartiallyRolledBack: RolledBack PartiallyRolledBack")
    assert view.ended_line("ledger/run-1", *done) == "ledger/run-1: partly rolled back: RolledBack PartiallyRolledBack"
    assert view.ended_line("ledger/run-1", True, "1 step ran") == "ledger/run-1: rolled back: 1 step ran"


def test_a_watch_that_times_out_says_what_the_ledger_shows_and_asks_about_the_operator_only_without_a_sign() -> None:
    silent = view.watch_timeout(ledger(2, True), "ledger/run-1", 3, 600)
    assert "has not planned the request (generation 3)" in silent and "is the operator running" in silent
    going = view.watch_timeout(ledger(3, False, RolledBack=("False", "WaitingForApproval")), "ledger/run-1", 3, 600)
    assert "the rollback goes on (WaitingForApproval: RolledBack WaitingForApproval)" in going
    assert "operator running" not in going
    broken = view.watch_timeout(ledger(2, True, Degraded=("True", "DecisionsWriteFailed")), "ledger/run-1", 3, 600)
    assert broken.startswith("error: timed out after 600s: ledger/run-1 is Degraded (DecisionsWriteFailed)")


def test_the_commands_a_timed_out_watch_suggests_name_the_ledgers_namespace_so_they_work_as_written() -> None:
    going = ledger(3, False, RolledBack=("False", "InProgress"))
    going["metadata"] = {"name": "run-1", "namespace": "shop"}
    said = view.watch_timeout(going, "ledger/run-1", 3, 600)
    assert "`kubectl get ledger/run-1 -n shop -w`" in said
    assert "kubectl get events -n shop --field-selector involvedObject.name=run-1" in said
    silent = ledger(2, True)
    silent["metadata"] = {"name": "run-1", "namespace": "shop"}
    assert "kubectl get events -n shop --field-selector" in view.watch_timeout(silent, "ledger/run-1", 3, 600)
    assert view.ns_flag("shop") == " -n shop"
    assert view.ns_flag(None) == view.ns_flag("") == ""  # kubectl's own default: nothing to add


def test_watch_says_what_a_fenced_rollback_waits_for_before_it_plans() -> None:
    from unwind.cli.plugin_view import waiting_line

    waiting = {"status": {"conditions": [
        {"type": "RollbackPlanned", "status": "Unknown", "reason": "WaitingForCalls", "observedGeneration": 3,
         "message": "the run is closed to new calls; waiting for 1 call in flight to finish or pass its "
                    "deadline (pay-9; until 2026-11-30T10:00:40.000Z at the latest), then the plan is made"}]}}
    assert waiting_line(waiting, 3) == (
        "waiting: the run is closed to new calls; waiting for 1 call in flight to finish or pass its "
        "deadline (pay-9; until 2026-11-30T10:00:40.000Z at the latest), then the plan is made")
    assert waiting_line(waiting, 4) is None  # an older request's wait
    planned = {"status": {"conditions": [{"type": "RollbackPlanned", "status": "True", "reason": "Planned",
                                          "observedGeneration": 3, "message": "frozen"}]}}
    assert waiting_line(planned, 3) is None


def test_watch_says_which_step_cannot_start_and_why_from_the_rolled_back_condition() -> None:
    def obj(reason: str, gen: int = 3) -> dict[str, Any]:
        return {"status": {"conditions": [{"type": "RolledBack", "status": "False", "reason": reason,
                                           "observedGeneration": gen, "message": "step 1 (c-1 inverse) "
                                           "(Job j) cannot start: Secret 'tickets-api' not found"}]}}
    line = view.stuck_line(obj("StepStuck"), 3)
    assert line is not None and line.startswith("stuck: step 1") and "tickets-api" in line
    assert view.stuck_line(obj("InProgress"), 3) is None
    assert view.stuck_line(obj("StepStuck", gen=2), 3) is None  # a previous request's
