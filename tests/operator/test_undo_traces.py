"""The undo Jobs continue the trace of the call they undo: the entry's traceparent and the
operator's OTLP endpoint go into the Job's environment (the step's span: tests/rollback/
test_undo_step.py), and nothing of it when the operator does not trace."""

from __future__ import annotations

from typing import Any

import pytest
from test_rollback_decisions import NOW, ROOT, ledger, story

from unwind.ledger.entry import Entry
from unwind.ledger.plan import Versions
from unwind.operator.rollback import Context, decide
from unwind.operator.undojob import ENTRY_ANNOTATION, trace_env
from unwind.undo.sources import load_versions

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
OTLP = (("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector.monitoring:4318"),)


@pytest.fixture(scope="module")
def tools() -> Versions:
    return load_versions([str(ROOT / "manifests"), str(ROOT / "tests/rollback/extra.yaml")])


def first_job(entries: list[Entry], tools: Versions, trace: tuple[tuple[str, str], ...]
              ) -> tuple[dict[str, str], str]:
    d = decide(ledger(entries), lambda: tools, {}, {},
               Context("shop", NOW, "unwind:test", 1, trace_env=trace))
    [job] = d.jobs
    env = {e["name"]: e["value"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    return env, job["metadata"]["annotations"][ENTRY_ANNOTATION]


def traced(entries: list[Entry]) -> list[Entry]:
    return [e.model_copy(update={"traceparent": TRACEPARENT}) for e in entries]


def test_a_job_gets_the_undone_calls_traceparent_and_the_operators_otlp_endpoint(
        tools: Versions) -> None:
    env, entry = first_job(traced(story(tools)), tools, OTLP)
    assert entry and env["TRACEPARENT"] == TRACEPARENT
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector.monitoring:4318"


def test_an_operator_that_does_not_trace_gives_its_jobs_no_trace(tools: Versions) -> None:
    env, _ = first_job(traced(story(tools)), tools, ())
    assert not {k for k in env if k == "TRACEPARENT" or k.startswith("OTEL_")}


def test_an_entry_written_without_a_trace_gives_its_job_none(tools: Versions) -> None:
    env, _ = first_job(story(tools), tools, OTLP)
    assert "TRACEPARENT" not in env and "OTEL_EXPORTER_OTLP_ENDPOINT" in env


def test_the_jobs_get_the_otlp_endpoint_and_sampler_but_never_the_exporters_headers() -> None:
    environ: dict[str, Any] = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                               "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer s3cret",
                               "OTEL_TRACES_SAMPLER": "parentbased_always_on", "HOME": "/root"}
    assert dict(trace_env(environ)) == {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                                        "OTEL_TRACES_SAMPLER": "parentbased_always_on"}


def test_an_entry_refuses_a_traceparent_that_is_not_one() -> None:
    from pydantic import ValidationError

    base = story_entry()
    with pytest.raises(ValidationError, match="traceparent"):
        Entry.model_validate({**base.to_json(), "traceparent": "00-x-y-01\nInjected: 1"})


def story_entry() -> Entry:
    return Entry.model_validate({"id": "e1", "tool": "t.x", "actor": "a", "state": "succeeded",
                                 "times": {"requested": "2026-12-03T00:00:00Z"}})
