"""The build modules the control plane and the node are built from (operator/unwind/controlplane/
gobuild), and how their binaries are keyed in the cache: pure checks, no Go build."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from unwind.controlplane import build
from unwind.controlplane.build import PARTS, BuildError, Part

KUBERNETES_GO_MOD = """\
module k8s.io/kubernetes

go 1.26.0

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/apimachinery => ./staging/src/k8s.io/apimachinery
\tk8s.io/apiserver => ./staging/src/k8s.io/apiserver
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/component-base => ./staging/src/k8s.io/component-base
\tk8s.io/kubelet => ./staging/src/k8s.io/kubelet
)
"""


def minor(version: str) -> int:
    return int(version.split(".")[1])


@pytest.mark.parametrize("part", PARTS, ids=lambda p: p.name)
def test_each_build_module_pins_every_staging_module_to_its_kubernetes_release(part: Part) -> None:
    go_mod = (part.module / "go.mod").read_text()
    assert build.pin_problems(go_mod) == []
    _, m, patch = part.kube_version.split(".")
    assert len(build.staging_pins(go_mod)) >= 30  # Kubernetes has 30-odd staging modules
    assert all(v == f"v0.{m}.{patch}" for _, v in build.staging_pins(go_mod).values())
    # the commands built are the module's tools: `go mod tidy` keeps what they import
    assert sorted(re.findall(r"^tool\s+(\S+)$", go_mod, re.M)) == sorted(pkg for pkg, _ in part.commands)
    assert (part.module / "go.sum").stat().st_size > 10_000


def test_the_node_is_at_most_three_minors_older_than_the_control_plane_and_never_newer() -> None:
    control_plane, node = (p.kube_version for p in PARTS)
    assert 0 <= minor(control_plane) - minor(node) <= 3  # Kubernetes' version skew policy
    assert minor(control_plane) >= 29  # native sidecars on by default


def test_a_build_module_is_written_from_the_kubernetes_go_mod_it_requires() -> None:
    text = build.module_text(PARTS[1], "1.35.4", KUBERNETES_GO_MOD)
    assert build.module_kube_version(text) == "1.35.4"
    assert build.pin_problems(text) == []
    assert "\tk8s.io/kubelet => k8s.io/kubelet v0.35.4" in text
    assert "tool k8s.io/kubernetes/cmd/kubelet" in text
    with pytest.raises(BuildError, match="replaces no staging module"):
        build.module_text(PARTS[1], "1.35.4", "module example.com/x\n")


def test_a_path_replacement_or_another_release_is_named_as_a_wrong_pin() -> None:
    text = build.module_text(PARTS[0], "1.37.2", KUBERNETES_GO_MOD)
    wrong = text.replace("k8s.io/api => k8s.io/api v0.37.2", "k8s.io/api => ./staging/src/k8s.io/api") \
        .replace("k8s.io/kubelet => k8s.io/kubelet v0.37.2", "k8s.io/kubelet => k8s.io/kubelet v0.36.1")
    problems = build.pin_problems(wrong)
    assert any(p.startswith("k8s.io/kubelet => k8s.io/kubelet v0.36.1: expected") for p in problems), problems
    assert "k8s.io/api is not pinned (expected k8s.io/api => k8s.io/api v0.37.2)" in problems
    with pytest.raises(BuildError, match=r"must require k8s\.io/kubernetes once"):
        build.module_kube_version("module x\n")


def test_binaries_are_cached_by_version_and_module_digest_apart_from_the_1_20_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UNWIND_CACHE_DIR", str(tmp_path))
    module = tmp_path / "gobuild" / "node"
    module.mkdir(parents=True)
    (module / "go.mod").write_text(build.module_text(PARTS[1], "1.35.4", KUBERNETES_GO_MOD))
    (module / "go.sum").write_text("k8s.io/api v0.35.4 h1:x\n")
    monkeypatch.setattr(build, "GOBUILD", tmp_path / "gobuild")
    part = Part("node", PARTS[1].commands)
    first = build.part_dir(part, "go1.26.8")
    assert first.parent == tmp_path and first.name.startswith("kube-go-node-1.35.4-")
    assert first.name != "kube-1.20.2"
    (module / "go.sum").write_text("k8s.io/api v0.35.4 h1:y\n")
    assert build.part_dir(part, "go1.26.8") != first  # another dependency: another cache
    assert build.part_dir(part, "go1.27.0") != build.part_dir(part, "go1.26.8")


def test_the_binaries_say_their_kubernetes_version() -> None:
    flags = build.version_ldflags("1.37.2")
    assert flags.startswith("-s -w ")
    for pkg in build.VERSION_PACKAGES:
        assert f"-X {pkg}.gitVersion=v1.37.2" in flags and f"-X {pkg}.gitMinor=37" in flags


def test_an_old_go_is_refused_with_the_version_needed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "go"
    fake.write_text("#!/bin/sh\necho go1.19.8\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    build.go_version.cache_clear()
    try:
        with pytest.raises(BuildError, match=r"`go` is go1.19.8; the control plane needs Go 1.26 or newer"):
            build.go_version()
    finally:
        build.go_version.cache_clear()


def test_the_build_runs_on_the_standard_library_alone_so_install_starts_it_before_the_venv() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    # -S: no site-packages, as a fresh machine's python3 has none of the project's dependencies
    proc = subprocess.run([sys.executable, "-S", "-c", "import unwind.controlplane.build as b; print(b.PARTS[0].name)"],
                          env={"PYTHONPATH": str(root / "operator"), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "controlplane"
    assert "unwind.controlplane.build" in (root / "scripts" / "install.sh").read_text()
