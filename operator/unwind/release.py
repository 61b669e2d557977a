"""Release artifacts: the chart packaged exactly as ``helm package`` packages it.

    .venv/bin/python -m unwind.release [--dest dist]    # -> dist/unwind-<version>.tgz

There is no helm binary here: Helm's own Go library does it, through ``helm_python``
(helm-python-sdk, a dev dependency), so the archive is helm's (``unwind/Chart.yaml``,
``unwind/values.yaml``, ``unwind/crds/...``, ``.helmignore`` honoured). The version is
pyproject.toml's (the one place it is written, see ``unwind.__version__``); a chart whose
``version`` or ``appVersion`` says otherwise is refused, naming the file to fix, so a packaged
chart always installs the image of its own version.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "unwind"


class ReleaseError(Exception):
    """A release artifact cannot be made as asked; the message says what to fix."""


def project_version(root: Path = ROOT) -> str:
    """``[project].version`` of pyproject.toml: the version of everything released."""
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def chart_versions(chart: Path = CHART) -> tuple[str, str]:
    """(version, appVersion) of a chart's Chart.yaml, as strings."""
    meta = yaml.safe_load((chart / "Chart.yaml").read_text()) or {}
    return str(meta.get("version", "")), str(meta.get("appVersion", ""))


# Where the version is written down besides pyproject.toml. Chart.yaml is read as YAML; the
# image's label must be there; the rest are mentions in prose and examples, checked when found.
IMAGE_LABEL = re.compile(r'org\.opencontainers\.image\.version="([^"]*)"')
MENTIONS = (
    re.compile(r"\bunwind:(\d+\.\d+\.\d+\S*?)(?=[\s`'\"]|$)", re.M),   # an image reference
    re.compile(r"\bunwind-(\d+\.\d+\.\d+\S*?)\.tgz"),               # the packaged chart
    re.compile(r"\bunwind_operator-(\d+\.\d+\.\d+\S*?)-py3"),         # the wheel
    re.compile(r"appVersion\W+\(`(\d+\.\d+\.\d+\S*?)`\)"),           # docs/chart.md's value table
)
MENTION_FILES = ("README.md", "DEVELOPMENT.md", "Dockerfile", "docs/*.md", "charts/unwind/*.yaml",
                 "charts/unwind/templates/*", "examples/*", "tests/e2e/*", ".pre-commit-hooks.yaml")


def _mentions(root: Path) -> Iterator[tuple[str, int, str]]:
    """(file, line, version) of every version written in the files that name one."""
    for pattern in MENTION_FILES:
        for path in sorted(root.glob(pattern)):
            if not path.is_file():
                continue
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                for regex in MENTIONS:
                    for match in regex.finditer(line):
                        yield str(path.relative_to(root)), number, match.group(1)


def version_mismatches(root: Path = ROOT) -> list[str]:
    """Every copy of the version that is not pyproject.toml's, as ``file[:line]: why``."""
    want = project_version(root)
    problems: list[str] = []
    chart = root / "charts" / "unwind"
    version, app_version = chart_versions(chart)
    for key, value in (("version", version), ("appVersion", app_version)):
        if value != want:
            problems.append(f"charts/unwind/Chart.yaml: {key} is {value!r}, pyproject.toml says {want!r}")
    labels = IMAGE_LABEL.findall((root / "Dockerfile").read_text())
    if labels != [want]:
        problems.append(f"Dockerfile: label org.opencontainers.image.version is {labels or 'missing'}, "
                        f"pyproject.toml says {want!r}")
    for file, line, value in _mentions(root):
        if value != want:
            problems.append(f"{file}:{line}: says {value}, pyproject.toml says {want}")
    return problems


def package_chart(dest: Path, chart: Path = CHART, root: Path = ROOT) -> Path:
    """``helm package`` of ``chart`` into ``dest``: ``dest/unwind-<version>.tgz``."""
    import helm_python as helm

    want = project_version(root)
    version, app_version = chart_versions(chart)
    if (version, app_version) != (want, want):
        raise ReleaseError(f"{chart / 'Chart.yaml'}: version {version!r} and appVersion "
                           f"{app_version!r} must both be {want!r}, the version in "
                           f"{root / 'pyproject.toml'}: set them and package again")
    dest.mkdir(parents=True, exist_ok=True)
    out = Path(helm.package(chart, destination=dest))
    expected = dest / f"{chart.name}-{want}.tgz"
    if out.resolve() != expected.resolve():
        raise ReleaseError(f"helm wrote {out}, expected {expected}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m unwind.release",
                                     description="package charts/unwind as helm package does")
    parser.add_argument("--dest", default=str(ROOT / "dist"),
                        help="folder for unwind-<version>.tgz (default: dist/ of the repository)")
    args = parser.parse_args(argv)
    try:
        print(package_chart(Path(args.dest)))
    except (ReleaseError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
