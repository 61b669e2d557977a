"""What the operator says about an undo pod that cannot start (operator/undo_pods.py)."""

from __future__ import annotations

from typing import Any

from unwind.operator.jobs import job_views
from unwind.operator.undo_pods import job_problem, pod_problem


def _pod(name: str = "unwind-undo-1-abc", *, phase: str = "Pending", waiting: dict[str, Any] | None = None,
         conditions: list[dict[str, Any]] | None = None, statuses: list[dict[str, Any]] | None = None,
         created: str = "2026-12-03T14:00:00Z") -> dict[str, Any]:
    cs = statuses if statuses is not None else (
        [{"name": "step", "ready": False, "restartCount": 0, "image": "unwind:dev",
          "state": {"waiting": waiting}}] if waiting else [])
    return {"metadata": {"name": name, "namespace": "tickets", "uid": f"uid-{name}",
                         "creationTimestamp": created,
                         "ownerReferences": [{"kind": "Job", "name": "j1", "uid": "job-uid", "controller": True}]},
            "status": {"phase": phase, "conditions": conditions or [], "containerStatuses": cs}}


def _event(pod: str, reason: str, message: str, *, type_: str = "Warning", uid: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": f"{pod}.1", "namespace": "tickets"}, "type": type_, "reason": reason,
            "message": message, "lastTimestamp": "2026-12-03T14:00:05Z",
            "involvedObject": {"kind": "Pod", "name": pod, "namespace": "tickets", "uid": uid or f"uid-{pod}"}}


MOUNT = ('MountVolume.SetUp failed for volume "s-tickets-api-1a2b3c4d" : secret "tickets-api" not found')


def test_a_pod_waiting_on_a_deleted_secret_names_the_secret_and_the_fix() -> None:
    pod = _pod(waiting={"reason": "ContainerCreating"})
    said = pod_problem(pod, [_event(pod["metadata"]["name"], "FailedMount", MOUNT)])
    assert said is not None
    assert "unwind-undo-1-abc" in said and "Secret 'tickets-api' not found" in said
    assert "recreate the Secret tickets-api in namespace tickets" in said


def test_an_env_secret_that_is_missing_is_named_from_the_waiting_message() -> None:
    pod = _pod(waiting={"reason": "CreateContainerConfigError", "message": 'secret "db-creds" not found'})
    said = pod_problem(pod, [])
    assert said is not None and "CreateContainerConfigError" in said and "Secret 'db-creds'" in said


def test_a_missing_configmap_is_named_as_a_configmap() -> None:
    pod = _pod(waiting={"reason": "ContainerCreating"})
    said = pod_problem(pod, [_event(pod["metadata"]["name"], "FailedMount",
                                    'MountVolume.SetUp failed for volume "c" : configmap "ca" not found')])
    assert said is not None and "ConfigMap 'ca' not found" in said


def test_an_image_that_cannot_be_pulled_is_reported() -> None:
    pod = _pod(waiting={"reason": "ImagePullBackOff", "message": 'Back-off pulling image "unwind:nope"'})
    said = pod_problem(pod, [])
    assert said is not None and "cannot be pulled" in said and "unwind:nope" in said


def test_an_unschedulable_pod_is_reported_with_the_schedulers_words() -> None:
    pod = _pod(conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": "0/1 nodes are available: 1 Insufficient memory."}])
    said = pod_problem(pod, [])
    assert said is not None and "Insufficient memory" in said


def test_an_oom_killed_step_is_reported_even_when_the_pod_failed() -> None:
    pod = _pod(phase="Failed", statuses=[{"name": "step", "state": {"terminated": {"reason": "OOMKilled",
                                                                                    "exitCode": 137}}}])
    said = pod_problem(pod, [])
    assert said is not None and "OOMKilled" in said


def test_a_pod_that_is_simply_starting_is_not_called_stuck() -> None:
    pod = _pod(waiting={"reason": "ContainerCreating"})
    assert pod_problem(pod, [_event(pod["metadata"]["name"], "Scheduled", "assigned", type_="Normal")]) is None
    assert pod_problem(_pod(phase="Running"), []) is None


def test_another_pods_events_are_not_read_as_this_ones() -> None:
    pod = _pod(waiting={"reason": "ContainerCreating"})
    other = _event(pod["metadata"]["name"], "FailedMount", MOUNT, uid="uid-of-an-older-pod-of-that-name")
    assert pod_problem(pod, [other]) is None


def test_the_job_reports_its_newest_stuck_pod() -> None:
    old = _pod("p-old", waiting={"reason": "ImagePullBackOff"}, created="2026-12-03T13:00:00Z")
    new = _pod("p-new", waiting={"reason": "ContainerCreating"}, created="2026-12-03T14:00:00Z")
    said = job_problem([old, new], [_event("p-new", "FailedMount", MOUNT)])
    assert said.startswith("pod p-new")


def test_a_running_jobs_view_carries_the_cause_and_a_finished_ones_does_not() -> None:
    pod = _pod(waiting={"reason": "ContainerCreating"})
    events = [_event(pod["metadata"]["name"], "FailedMount", MOUNT)]
    job = {"metadata": {"name": "j1", "uid": "job-uid"}, "status": {"active": 1}}
    assert "tickets-api" in job_views([job], [pod], events)["j1"].stuck
    done = {"metadata": {"name": "j1", "uid": "job-uid"},
            "status": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]}}
    assert job_views([done], [pod], events)["j1"].stuck == ""
