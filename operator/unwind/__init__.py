"""Unwind: declared, approved, signed, recorded and undoable tool-call effects on Kubernetes."""

from __future__ import annotations

API_GROUP = "unwind.dev"
API_VERSION = "v1alpha1"
DISTRIBUTION = "unwind-operator"


def _version() -> str:
    """The version is written in one place, pyproject.toml: read here from the installed
    distribution's metadata (the wheel, the image, an editable install), else from the
    pyproject.toml beside the source when run uninstalled (``PYTHONPATH=operator``).
    Chart.yaml and the Dockerfile carry copies; tests/test_release.py fails when one differs."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    import tomllib
    from pathlib import Path

    try:
        project = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
        return str(project["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"


__version__ = _version()
