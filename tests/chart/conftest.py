"""Fixtures for the chart tests: a private copy of charts/unwind, so no test can write into
the chart that ships."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "unwind"


@pytest.fixture(scope="session")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("chart") / "unwind"
    shutil.copytree(CHART_DIR, copy)
    return copy
