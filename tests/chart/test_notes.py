"""The chart's NOTES say what was installed (issue 18: they said one replica; the default is 2)."""

from __future__ import annotations

from pathlib import Path

import helm_python as helm
import pytest

CHART = Path(__file__).resolve().parents[2] / "charts" / "unwind"


def notes(values: dict[str, object] | None = None) -> str:
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values or {}, name="unwind", namespace="unwind-system", is_install=True)
    return str(rendered["unwind/templates/NOTES.txt"])


@pytest.mark.parametrize(("replicas", "said"), [
    (None, "(2 replicas, one leading;"), (3, "(3 replicas, one leading;"), (1, "(1 replica;")])
def test_the_notes_name_the_operator_replicas_the_release_runs(replicas: int | None, said: str) -> None:
    values = {"operator": {"replicas": replicas}} if replicas is not None else None
    text = notes(values)
    assert said in text, text
    assert "one replica" not in text


def test_the_notes_do_not_say_the_webhook_will_record_appliers_some_day() -> None:
    text = notes({"operator": {"trustedAppliers": ["*"]}})
    assert "once the admission webhook records appliers" not in text
    assert "unwind.dev/applied-by" in text
