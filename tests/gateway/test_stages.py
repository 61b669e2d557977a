"""The call path's shape (issue 31): ``Gateway`` is the composition of its stages, one
concern per module, each small enough to read whole."""

from __future__ import annotations

import inspect
from pathlib import Path

from unwind.gateway import stages
from unwind.gateway.enforce import Gateway
from unwind.gateway.stages.base import Stage

STAGES = Path(stages.__file__).parent


def test_every_stage_module_is_under_250_lines() -> None:
    sizes = {p.name: len(p.read_text().splitlines()) for p in STAGES.glob("*.py")}
    assert len(sizes) >= 9, sizes
    assert {name: n for name, n in sizes.items() if n > 250} == {}


def test_the_gateway_is_composed_of_every_stage_and_each_method_has_one_home() -> None:
    # admission.py is the doors' stage (rate limits before, trace attributes after): below
    modules = {p.stem for p in STAGES.glob("*.py")} - {"__init__", "base", "admission"}
    composed = {cls.__module__.rsplit(".", 1)[-1] for cls in Gateway.__mro__
                if cls.__module__.startswith("unwind.gateway.stages.") and cls is not Stage}
    assert composed == modules
    homes: dict[str, list[str]] = {}
    for cls in Gateway.__mro__:
        if cls.__module__.startswith("unwind.gateway.stages.") and cls is not Stage:
            for name, value in vars(cls).items():
                if inspect.isfunction(value):
                    homes.setdefault(name, []).append(cls.__name__)
    assert {name: where for name, where in homes.items() if len(where) > 1} == {}
    # what base.py only declares is defined by a stage (or the composition) that comes first
    for name, value in vars(Stage).items():
        if inspect.isfunction(value) and name != "ledger":
            assert getattr(Gateway, name) is not value, f"{name} is only declared"


def test_both_doors_take_rate_limits_and_trace_attributes_from_the_admission_stage() -> None:
    gateway = STAGES.parent
    for door in ("rest.py", "mcp_guard.py", "mcp_server.py"):
        text = (gateway / door).read_text()
        assert "stages.admission import" in text, door
        assert "limiter.check(" not in text and "tracing.annotate(" not in text, door
