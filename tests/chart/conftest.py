"""Fixtures for the chart tests: a copy of charts/unwind that always has a CRD.

charts/unwind/crds/ belongs to the CRD generator; these tests never write into it.
While it is still empty, the copy gets a placeholder CRD so that lint, render and
install see the chart as it will ship.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

CHART_DIR = Path(__file__).resolve().parents[2] / "charts" / "unwind"

PLACEHOLDER_CRD = """\
# Placeholder for the tests only: the real CRDs are generated into charts/unwind/crds/.
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: placeholders.unwind.dev
spec:
  group: unwind.dev
  names:
    kind: Placeholder
    plural: placeholders
    singular: placeholder
  scope: Namespaced
  versions:
    - name: v1alpha1
      served: true
      storage: true
      schema:
        openAPIV3Schema:
          type: object
          x-kubernetes-preserve-unknown-fields: true
"""


@pytest.fixture(scope="session")
def chart_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("chart") / "unwind"
    shutil.copytree(CHART_DIR, copy)
    crds = copy / "crds"
    if not crds.is_dir() or not any(crds.glob("*.yaml")):
        crds.mkdir(exist_ok=True)
        (crds / "placeholder.yaml").write_text(PLACEHOLDER_CRD)
    return copy
