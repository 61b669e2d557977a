"""Release artifacts: one version, written in pyproject.toml and copied nowhere it can drift;
the chart packaged as `helm package` makes it; the LICENSE the image's label names; a
CHANGELOG; CI snippets a reader can paste as they are."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import helm_python as helm
import pytest
import yaml

import unwind
from unwind.release import (
    ReleaseError,
    chart_versions,
    package_chart,
    project_version,
    version_mismatches,
)

ROOT = Path(__file__).resolve().parents[1]
VERSION = project_version(ROOT)


def copy_of_release_files(tmp_path: Path) -> Path:
    """The files version_mismatches reads, in a tree of their own that a test may spoil."""
    root = tmp_path / "repo"
    for rel in ("pyproject.toml", "Dockerfile", "README.md"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / rel, root / rel)
    shutil.copytree(ROOT / "charts" / "unwind", root / "charts" / "unwind")
    shutil.copytree(ROOT / "docs", root / "docs")
    return root


# --- one version --------------------------------------------------------------------------


def test_the_version_the_code_reports_is_pyprojects() -> None:
    assert unwind.__version__ == VERSION
    out = subprocess.run([sys.executable, "-m", "unwind.cli.main", "--version"],
                         capture_output=True, text=True, check=True).stdout
    assert out == f"unwind {VERSION}\n"


def test_every_copy_of_the_version_agrees_with_pyproject() -> None:
    """Chart.yaml's version and appVersion, the image's label, and every image tag, chart
    archive or wheel name the docs write: a release bumps pyproject.toml and these."""
    assert version_mismatches(ROOT) == []
    assert chart_versions(ROOT / "charts" / "unwind") == (VERSION, VERSION)


@pytest.mark.parametrize(("rel", "old", "new", "named"), [
    ("charts/unwind/Chart.yaml", f'appVersion: "{VERSION}"', 'appVersion: "9.9.9"',
     "charts/unwind/Chart.yaml: appVersion"),
    ("charts/unwind/Chart.yaml", f"version: {VERSION}\n", "version: 9.9.9\n",
     "charts/unwind/Chart.yaml: version"),
    ("Dockerfile", f'image.version="{VERSION}"', 'image.version="9.9.9"', "Dockerfile: label"),
    ("docs/chart.md", f"docker build -t unwind:{VERSION} .", "docker build -t unwind:9.9.9 .",
     "docs/chart.md:"),
])
def test_a_copy_of_the_version_that_drifts_is_named(tmp_path: Path, rel: str, old: str, new: str,
                                                    named: str) -> None:
    root = copy_of_release_files(tmp_path)
    text = (root / rel).read_text()
    assert old in text
    (root / rel).write_text(text.replace(old, new, 1))
    problems = version_mismatches(root)
    assert len(problems) == 1 and problems[0].startswith(named) and "9.9.9" in problems[0]


def test_an_image_without_a_version_label_is_named(tmp_path: Path) -> None:
    root = copy_of_release_files(tmp_path)
    dockerfile = root / "Dockerfile"
    dockerfile.write_text(re.sub(r' \\\n\s*org\.opencontainers\.image\.version="[^"]*"', "",
                                 dockerfile.read_text()))
    assert version_mismatches(root) == [
        f"Dockerfile: label org.opencontainers.image.version is missing, pyproject.toml says {VERSION!r}"]


# --- the chart, packaged --------------------------------------------------------------------


def test_the_packaged_chart_is_helms_archive_named_after_the_version(tmp_path: Path) -> None:
    out = package_chart(tmp_path / "dist")
    assert out == tmp_path / "dist" / f"unwind-{VERSION}.tgz"
    with tarfile.open(out) as tar:
        names = tar.getnames()
        meta = yaml.safe_load(tar.extractfile("unwind/Chart.yaml").read())  # type: ignore[union-attr]
    assert {"unwind/Chart.yaml", "unwind/values.yaml", "unwind/values.schema.json",
            "unwind/templates/deployment.yaml", "unwind/crds/effectledger.yaml"} <= set(names)
    assert all(n.startswith("unwind/") for n in names)
    assert (meta["version"], meta["appVersion"]) == (VERSION, VERSION)
    # Helm loads the archive and renders it: the operator runs the image of its own version.
    with helm.Chart.load_archive(out.read_bytes()) as chart:
        rendered = chart.render(None, name="unwind", namespace="unwind-system", is_install=True)
    deployment = next(doc for doc in yaml.safe_load_all(io.StringIO(
        rendered["unwind/templates/deployment.yaml"])) if doc)
    image = deployment["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"unwind:{VERSION}"


def test_packaging_refuses_a_chart_whose_app_version_is_not_the_projects(tmp_path: Path) -> None:
    chart = tmp_path / "unwind"
    shutil.copytree(ROOT / "charts" / "unwind", chart)
    meta = chart / "Chart.yaml"
    meta.write_text(meta.read_text().replace(f'appVersion: "{VERSION}"', 'appVersion: "0.0.9"'))
    with pytest.raises(ReleaseError, match=r"Chart\.yaml: .*appVersion '0\.0\.9'.*pyproject\.toml"):
        package_chart(tmp_path / "dist", chart=chart)
    assert not (tmp_path / "dist").exists() or not any((tmp_path / "dist").iterdir())


def test_the_packaging_command_prints_the_archive_it_wrote(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "unwind.release", "--dest", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(tmp_path / f"unwind-{VERSION}.tgz")


# --- license, changelog, CI snippets --------------------------------------------------------


def test_the_license_file_is_the_apache_2_0_text_the_image_label_names() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "Dockerfile").read_text()
    assert 'license = { text = "Apache-2.0" }' in (ROOT / "pyproject.toml").read_text()


def test_the_changelog_has_an_unreleased_section_and_an_entry_for_this_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[:2] == ["Unreleased", VERSION]


PLACEHOLDER = re.compile(r"<(owner|tag|your[-_a-z]*|registry|version|org|repo)>", re.I)


def yaml_and_shell_blocks(text: str) -> list[str]:
    return re.findall(r"^```(?:ya?ml|sh|bash|console)\n(.*?)^```", text, re.M | re.S)


@pytest.mark.parametrize("rel", ["README.md", "docs/cli.md", "docs/install.md", "docs/agents.md",
                                 "docs/runbook.md", ".pre-commit-hooks.yaml"])
def test_snippets_to_copy_have_no_placeholders_to_fill_in(rel: str) -> None:
    text = (ROOT / rel).read_text()
    blocks = [text] if rel.endswith(".yaml") else yaml_and_shell_blocks(text)
    found = [m.group(0) for block in blocks for m in PLACEHOLDER.finditer(block)]
    assert found == [], f"{rel}: fill in {found}"


def ci_block(containing: str) -> dict[str, object]:
    """The YAML block of docs/cli.md's "Pre-commit and CI" section that holds `containing`."""
    text = (ROOT / "docs" / "cli.md").read_text()
    section = text[text.index("## Pre-commit and CI"):]
    section = section[:section.index("\n## ", 1)]
    blocks = [b for b in re.findall(r"^```yaml\n(.*?)^```", section, re.M | re.S) if containing in b]
    assert len(blocks) == 1, f"one block with {containing!r} in docs/cli.md"
    loaded = yaml.safe_load(blocks[0])
    assert isinstance(loaded, dict)
    return loaded


def with_unwind_on_path() -> dict[str, str]:
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}


def test_the_local_pre_commit_hooks_in_the_docs_are_the_shipped_hooks_and_pass_here() -> None:
    shipped = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    config = ci_block("repo: local")
    hooks = config["repos"][0]["hooks"]  # type: ignore[index]
    assert [h["id"] for h in hooks] == list(shipped)
    for hook in hooks:
        ship = shipped[hook["id"]]
        assert hook["entry"] == " ".join([ship["entry"], *ship["args"]])
        assert (hook["files"], hook["pass_filenames"]) == (ship["files"], ship["pass_filenames"])
        proc = subprocess.run(hook["entry"].split(), cwd=ROOT, env=with_unwind_on_path(),
                              capture_output=True, text=True)
        assert proc.returncode == 0, (hook["id"], proc.stdout + proc.stderr)


def test_the_ci_job_in_the_docs_runs_as_written_after_installing_unwind(tmp_path: Path) -> None:
    job = ci_block("jobs:")["jobs"]["manifests"]  # type: ignore[index]
    runs = [step["run"] for step in job["steps"] if "run" in step]
    assert runs[0] == "pip install ./unwind"  # the submodule: here, this checkout is installed
    (tmp_path / "tests").mkdir()
    (tmp_path / "manifests").symlink_to(ROOT / "manifests")
    (tmp_path / "tests" / "contracts").symlink_to(ROOT / "tests" / "contracts")
    for run in runs[1:]:
        proc = subprocess.run(["bash", "-c", run], cwd=tmp_path, env=with_unwind_on_path(),
                              capture_output=True, text=True)
        assert proc.returncode == 0, (run, proc.stdout + proc.stderr)
    assert json.loads((tmp_path / "lint.sarif").read_text())["version"] == "2.1.0"
    assert "<testsuite" in (tmp_path / "contract-tests.xml").read_text()


def heading_anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (code blocks left out)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.+)$", text, re.M)}


@pytest.mark.parametrize("rel", ["docs/install.md", "docs/agents.md", "docs/runbook.md",
                                 "CHANGELOG.md"])
def test_every_link_of_the_operating_pages_leads_to_a_file_and_heading_that_exist(rel: str) -> None:
    page = ROOT / rel
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (page.parent / file).resolve() if file else page
        if not linked.exists() or (anchor and anchor not in heading_anchors(linked)):
            broken.append(target)
    assert broken == []
