"""What the operator reads from an undo Job and its pods, and which ledger events wake the
rollback loop (operator/unwind/operator/jobs.py), without a cluster."""

from __future__ import annotations

from typing import Any

from unwind.operator.jobs import job_view, job_views, relevant


def job(*conditions: tuple[str, str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "run-undo-1-ab"},
            "status": {"conditions": [{"type": t, "status": s, "reason": r, "message": "m"}
                                      for t, s, r in conditions]}}


def pod(phase: str, created: str, message: str | None) -> dict[str, Any]:
    term = {"exitCode": 0 if phase == "Succeeded" else 1, **({"message": message} if message else {})}
    return {"metadata": {"creationTimestamp": created},
            "status": {"phase": phase, "containerStatuses": [{"state": {"terminated": term}}]}}


def test_a_complete_job_reads_the_message_of_its_succeeded_pod_even_after_a_failed_one() -> None:
    view = job_view(job(("Complete", "True", "")), [pod("Succeeded", "2026-01-01T00:00:05Z", '{"ok":true}'),
                                                     pod("Failed", "2026-01-01T00:00:09Z", '{"ok":false}')])
    assert (view.phase, view.message) == ("succeeded", '{"ok":true}')


def test_a_failed_job_reads_its_latest_pods_message_and_why_it_failed() -> None:
    view = job_view(job(("Failed", "True", "BackoffLimitExceeded")),
                    [pod("Failed", "2026-01-01T00:00:01Z", "first"), pod("Failed", "2026-01-01T00:00:20Z", "second")])
    assert (view.phase, view.message) == ("failed", "second")
    assert view.why == "BackoffLimitExceeded: m"


def test_a_job_without_a_finished_condition_is_running_and_a_pod_without_message_gives_none() -> None:
    view = job_view(job(("Failed", "False", "")), [pod("Failed", "2026-01-01T00:00:01Z", None)])
    assert (view.phase, view.message) == ("running", None)


def test_a_pod_counts_for_a_job_only_when_the_job_is_its_controlling_owner() -> None:
    # a user who may create pods labels one like the Job's and writes {"ok": true} on exit
    made = pod("Failed", "2026-01-01T00:00:01Z", '{"ok":false}')
    made["metadata"].update(labels={"job-name": "run-undo-1-ab"},
                            ownerReferences=[{"kind": "Job", "name": "run-undo-1-ab", "uid": "u-1", "controller": True}])
    forged = pod("Succeeded", "2026-01-01T00:00:09Z", '{"ok":true}')
    forged["metadata"].update(labels={"job-name": "run-undo-1-ab"})
    other = pod("Succeeded", "2026-01-01T00:00:09Z", '{"ok":true}')
    other["metadata"].update(ownerReferences=[{"kind": "Job", "name": "run-undo-1-ab", "uid": "u-2", "controller": True}])
    the_job = job(("Failed", "True", "BackoffLimitExceeded"))
    the_job["metadata"]["uid"] = "u-1"
    views = job_views([the_job], [made, forged, other])
    assert views["run-undo-1-ab"].message == '{"ok":false}'


def test_only_ledgers_with_a_rollback_a_lost_answer_or_a_stale_live_count_wake_the_loop() -> None:
    assert not relevant({"spec": {"run": "r"}, "status": {"entries": [{"state": "succeeded"}],
                                                          "live": 1}})
    assert relevant({"spec": {"run": "r"}, "status": {"entries": [{"state": "succeeded"}]}})
    assert relevant({"spec": {"run": "r"}, "status": {"entries": [{"state": "succeeded"}] * 2,
                                                      "live": 1}})
    assert not relevant({"spec": {"run": "r"}, "status": {"entries": [
        {"state": "succeeded", "effect": "idempotent"}, {"state": "undone"}], "live": 0}})
    assert relevant({"spec": {"run": "r", "page": 2}, "status": {"entries": []}})
    assert relevant({"spec": {"rollback": {"requested": True}}})
    assert relevant({"status": {"rollback": {"generation": 1, "steps": []}}})
    assert not relevant({"status": {"rollback": {"generation": 1, "finished": "t"}}})
    assert relevant({"status": {"entries": [{"state": "uncertain"}]}})
