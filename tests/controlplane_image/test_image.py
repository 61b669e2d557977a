"""Unit tests of unwind.controlplane.image: no real build, no buildah, no network."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from unwind.controlplane import image, imageimport, imageinputs
from unwind.controlplane.build import BuildError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("UNWIND_CACHE_DIR", str(d))
    return d


def make_context(root: Path) -> Path:
    """A small copy of the repository's layout, with the repository's own .dockerignore."""
    (root / "operator" / "unwind" / "__pycache__").mkdir(parents=True)
    (root / "operator" / "unwind" / "__init__.py").write_text("")
    (root / "operator" / "unwind" / "main.py").write_text("print('hi')\n")
    (root / "operator" / "unwind" / "__pycache__" / "main.cpython-311.pyc").write_bytes(b"\0pyc")
    (root / "operator" / "unwind.egg-info").mkdir()
    (root / "operator" / "unwind.egg-info" / "PKG-INFO").write_text("x")
    (root / "tests").mkdir()
    (root / "tests" / "test_x.py").write_text("def test(): pass\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / ".venv" / "bin" / "python").write_text("")
    (root / "Dockerfile").write_text("FROM scratch\n")
    (root / "pyproject.toml").write_text("[project]\nname='x'\n")
    (root / "README.md").write_text("readme\n")
    (root / ".dockerignore").write_text((REPO / ".dockerignore").read_text())
    return root


# --- .dockerignore ------------------------------------------------------------------

@pytest.mark.parametrize(("path", "ignored"), [
    (".git", True), (".git/config", True), (".venv/bin/python", True),
    ("operator/unwind/__pycache__/x.pyc", True), ("__pycache__/x.pyc", True),
    ("operator/unwind/x.pyc", True), ("operator/unwind/x.pyo", True),
    ("operator/unwind_operator.egg-info/PKG-INFO", True), ("x.egg-info", True),
    ("tests/test_x.py", True), ("docs/index.md", True), ("charts/unwind/values.yaml", True),
    ("Dockerfile", True), (".dockerignore", True),
    ("operator/unwind/main.py", False), ("pyproject.toml", False), ("README.md", False),
    ("operator/tests/test_y.py", False),  # `tests` is anchored at the context root
    ("operator/unwind/x.py", False), ("operator/unwind/x.pyx", False),
    ("Dockerfile.dev", False),
])
def test_the_repositorys_dockerignore(path: str, ignored: bool) -> None:
    rules = imageinputs.DockerIgnore.parse((REPO / ".dockerignore").read_text())
    assert rules.ignored(path) is ignored


def test_dockerignore_exceptions_comments_and_last_match() -> None:
    rules = imageinputs.DockerIgnore.parse(
        "# a comment\n\n*.md\n!README.md\n/build/\ndocs/**/*.png\n!docs/keep/**\nsub/?.txt\n"
        "[ab].cfg\n")
    assert rules.ignored("CHANGES.md")
    assert not rules.ignored("README.md")
    assert rules.ignored("build/x/y")
    assert rules.ignored("docs/a.png") and rules.ignored("docs/a/b/c.png")
    assert not rules.ignored("docs/keep/a.png")
    assert rules.ignored("sub/a.txt") and not rules.ignored("sub/ab.txt")
    assert rules.ignored("a.cfg") and not rules.ignored("c.cfg")
    assert not rules.ignored("docs/a.jpg")
    assert not rules.ignored("x/CHANGES.txt")


def test_context_files_follow_the_dockerignore(tmp_path: Path) -> None:
    root = make_context(tmp_path)
    assert imageinputs.context_files(root) == [
        "README.md", "operator/unwind/__init__.py", "operator/unwind/main.py", "pyproject.toml"]


def test_context_files_with_an_exception_look_inside_ignored_directories(tmp_path: Path) -> None:
    root = make_context(tmp_path)
    (root / ".dockerignore").write_text("tests\n!tests/test_x.py\n")
    files = imageinputs.context_files(root)
    assert "tests/test_x.py" in files
    assert "operator/unwind/__pycache__/main.cpython-311.pyc" in files


def test_the_real_context_is_the_package_and_its_metadata() -> None:
    files = imageinputs.context_files(REPO)
    assert {"pyproject.toml", "README.md", "operator/unwind/controlplane/image.py"} <= set(files)
    assert not any(f.startswith(("tests/", ".git/", ".venv/", "charts/")) for f in files)
    assert not any("__pycache__" in f or f.endswith(".pyc") for f in files)


# --- the inputs digest ----------------------------------------------------------------

def test_digest_changes_with_an_input_and_not_with_an_ignored_file(tmp_path: Path) -> None:
    root = make_context(tmp_path)
    first = image.image_inputs_digest(root)
    assert first == image.image_inputs_digest(root)
    for ignored in ("tests/test_x.py", "operator/unwind/__pycache__/main.cpython-311.pyc",
                    ".venv/bin/python", "operator/unwind.egg-info/PKG-INFO"):
        (root / ignored).write_text("changed")
    (root / "tests" / "new_test.py").write_text("new")
    (root / "operator" / "unwind" / "__pycache__" / "new.pyc").write_text("new")
    assert image.image_inputs_digest(root) == first

    (root / "operator" / "unwind" / "main.py").write_text("print('changed')\n")
    second = image.image_inputs_digest(root)
    assert second != first
    (root / "Dockerfile").write_text("FROM scratch\nUSER 1\n")  # ignored by COPY, still an input
    third = image.image_inputs_digest(root)
    assert third != second
    (root / "operator" / "unwind" / "new.py").write_text("")  # a new file is an input too
    assert image.image_inputs_digest(root) != third


def test_digest_depends_on_the_base_and_on_the_file_name(tmp_path: Path) -> None:
    root = make_context(tmp_path)
    assert image.image_inputs_digest(root, "a" * 64) != image.image_inputs_digest(root, "b" * 64)
    assert image.image_inputs_digest(root) == image.image_inputs_digest(root, image.base_key())
    before = image.image_inputs_digest(root)
    (root / "operator" / "unwind" / "main.py").rename(root / "operator" / "unwind" / "other.py")
    assert image.image_inputs_digest(root) != before


def test_executable_bit_is_an_input(tmp_path: Path) -> None:
    root = make_context(tmp_path)
    before = image.image_inputs_digest(root)
    (root / "operator" / "unwind" / "main.py").chmod(0o755)
    assert image.image_inputs_digest(root) != before


def test_base_and_pause_keys_are_stable_hex() -> None:
    for key in (image.base_key(), image.pause_key()):
        assert len(key) == 64 and int(key, 16) >= 0
    assert image.base_key() != image.pause_key()


# --- the Debian mirror -----------------------------------------------------------------

DEB822 = """\
Types: deb deb-src
# a comment
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://security.example/debian-security
Suites: bookworm-security
Components: main
"""


def test_mirror_from_deb822_sources(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    # the security entry sorts first by file name; the suite decides, not the order
    (tmp_path / "sources.list.d" / "a-security.sources").write_text(DEB822.split("\n\n")[1])
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    (tmp_path / "sources.list.d" / "other.sources.disabled").write_text(
        "Types: deb\nURIs: http://wrong.example/\nSuites: bookworm\n")
    assert imageinputs.debian_mirror("bookworm", tmp_path) == "http://mirror.example/debian"


def test_mirror_from_a_one_line_sources_list(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text(
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/usr/share/keyrings/k.gpg] http://mirror.example/debian/ bookworm main\n"
        "deb http://security.example/debian-security bookworm-security main\n")
    assert imageinputs.debian_mirror("bookworm", tmp_path) == "http://mirror.example/debian"


def test_mirror_disabled_and_fallback_entries(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "x.sources").write_text(
        "Types: deb\nURIs: http://off.example/\nSuites: bookworm\nEnabled: no\n\n"
        "Types: deb\nURIs: http://sec.example/\nSuites: bookworm-security\n\n"
        "Types: deb\nURIs: http://upd.example/\n  http://upd2.example/\nSuites: bookworm-updates\n")
    assert imageinputs.debian_mirror("bookworm", tmp_path) == "http://upd.example"


def test_no_mirror_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "sources.list").write_text("deb http://x.example/ trixie main\n")
    with pytest.raises(image.ImageError, match="no Debian apt source"):
        imageinputs.debian_mirror("bookworm", tmp_path)


def test_this_machine_has_a_mirror() -> None:
    if not Path("/etc/apt").is_dir():
        pytest.skip("not a Debian machine")
    assert imageinputs.debian_mirror().startswith(("http://", "https://", "file:/"))


# --- the host's pip settings -----------------------------------------------------------

def test_pip_config_merges_files_and_environment(tmp_path: Path) -> None:
    (tmp_path / "xdg" / "pip").mkdir(parents=True)
    (tmp_path / "xdg" / "pip" / "pip.conf").write_text(
        "[global]\nconstraint = /etc/c.txt\ntimeout = 10\n")
    (tmp_path / "home" / ".config" / "pip").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "pip" / "pip.conf").write_text(
        "[global]\ntimeout = 20\nextra-index-url = file:///opt/idx/simple https://x.example/s\n"
        "[install]\nno-compile = yes\n")
    env = {"XDG_CONFIG_DIRS": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home"),
           "PIP_DEFAULT_TIMEOUT": "180", "PIP_FIND_LINKS": "/opt/wheels", "PATH": "/bin"}
    conf = imageinputs.host_pip_config(env)
    assert conf["global"]["constraint"] == "/etc/c.txt"
    assert conf["global"]["timeout"] == "20"  # the user file wins over the global one
    assert conf["global"]["default-timeout"] == "180"
    assert conf["global"]["find-links"] == "/opt/wheels"
    assert conf["install"] == {"no-compile": "yes"}
    assert imageinputs.host_pip_config({**env, "PIP_CONFIG_FILE": "/dev/null"}) == {
        "global": {"default-timeout": "180", "find-links": "/opt/wheels"}}

    out = tmp_path / "pip.conf"
    imageinputs.write_pip_conf(conf, out)
    assert "extra-index-url = file:///opt/idx/simple https://x.example/s" in out.read_text()


def test_pip_mounts_are_the_local_paths_the_settings_name(tmp_path: Path) -> None:
    (tmp_path / "idx" / "simple").mkdir(parents=True)
    (tmp_path / "wheels").mkdir()
    (tmp_path / "c.txt").write_text("")
    conf = {"global": {
        "cert": "/etc/ssl/certs/ca-certificates.crt",  # under the CA mount already
        "constraint": str(tmp_path / "c.txt"),
        "extra-index-url": f"file://{tmp_path}/idx/simple https://x.example/simple",
        "find-links": f"{tmp_path}/wheels {tmp_path}/wheels/sub {tmp_path}/missing",
        "timeout": "/not/a/path/key",
    }}
    assert imageinputs.pip_mounts(conf) == [str(tmp_path / "c.txt"), str(tmp_path / "idx"),
                                      str(tmp_path / "wheels")]


# --- the cache hit path, failures -------------------------------------------------------

def forbid_commands(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    calls: list[Any] = []

    def fake_run(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        raise AssertionError(f"no command expected, got {args}")

    monkeypatch.setattr(subprocess, "run", fake_run)
    return calls


def test_cached_archives_mean_no_build(cache: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_context(tmp_path / "ctx")
    plan = image.planned_images(root)
    assert plan.unwind.tar.parent == cache / "images"
    assert plan.unwind.tar.name == f"unwind-{plan.unwind.key}.tar"
    for tar in (plan.unwind.tar, plan.pause.tar):
        tar.parent.mkdir(parents=True, exist_ok=True)
        tar.write_bytes(b"fake")
    calls = forbid_commands(monkeypatch)
    got = image.ensure_images(root)
    assert calls == []
    assert got.built == ()
    assert got.tars == (plan.unwind.tar, plan.pause.tar)
    assert got.unwind_image == "docker.io/library/unwind:dev" == image.UNWIND_IMAGE_CONTAINERD
    assert got.pause_image == image.PAUSE_IMAGE
    assert image.UNWIND_IMAGE_CONTAINERD in got.unwind.tags
    assert f"localhost/unwind:{plan.unwind.key[:12]}" in got.unwind.tags
    assert not (cache / "logs").exists()  # nothing ran, nothing logged

    (root / "operator" / "unwind" / "main.py").write_text("changed\n")
    assert image.planned_images(root).unwind.tar != plan.unwind.tar  # a change means a build


def test_only_the_missing_image_is_built(cache: Path, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_context(tmp_path / "ctx")
    plan = image.planned_images(root)
    plan.unwind.tar.parent.mkdir(parents=True)
    plan.unwind.tar.write_bytes(b"fake")
    done: list[str] = []

    def fake_pause(log: Any, img: image.BuiltImage, seconds: dict[str, float]) -> None:
        done.append("build " + img.name)

    def fake_export(log: Any, img: image.BuiltImage, seconds: dict[str, float]) -> None:
        done.append("export " + img.name)
        img.tar.write_bytes(b"archive")

    monkeypatch.setattr(image, "_build_pause", fake_pause)
    monkeypatch.setattr(image, "_export", fake_export)
    monkeypatch.setattr(image, "_prune_storage", lambda log, img: done.append("prune " + img.name))
    monkeypatch.setattr(image, "_build_unwind", lambda *a: pytest.fail("unwind is cached"))
    got = image.ensure_images(root)
    assert done == ["build pause", "export pause", "prune pause"]
    assert got.built == ("pause",)


def test_a_failed_step_names_the_step_and_the_log(cache: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_context(tmp_path / "ctx")
    plan = image.planned_images(root)
    plan.unwind.tar.parent.mkdir(parents=True)
    plan.unwind.tar.write_bytes(b"fake")
    real_run = subprocess.run

    def fake_run(cmd: list[str], **kwargs: Any) -> Any:
        if cmd[0] == "go":
            kwargs["stderr"].write("pause.go:1: syntax error\n")
            return subprocess.CompletedProcess(cmd, 2, "", None)
        return real_run(cmd, **kwargs)

    monkeypatch.setattr(subprocess, "run", fake_run)
    with pytest.raises(image.ImageError) as info:
        image.ensure_images(root)
    msg = str(info.value)
    assert "'pause: go build'" in msg and "exit 2" in msg
    log = Path(msg.rsplit("see log ", 1)[1])
    assert log.parent == cache / "logs" and log.exists()
    assert "syntax error" in log.read_text()
    assert isinstance(info.value, BuildError)  # callers catching build errors catch this too
    assert not list((cache / "images").glob("tmp-*"))  # the work directory is gone
    assert not plan.pause.tar.exists()


def test_an_unexpected_error_still_names_the_log(cache: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    root = make_context(tmp_path / "ctx")

    def boom(*a: Any) -> bool:
        raise PermissionError("denied")

    monkeypatch.setattr(image, "_ensure_base_in_storage", boom)
    with pytest.raises(image.ImageError, match=r"PermissionError: denied; see log .*/logs/image-"):
        image.ensure_images(root)


def test_log_redacts_the_mirror(tmp_path: Path) -> None:
    log = image._Log(tmp_path / "x.log", ["http://mirror.example/debian"])
    with pytest.raises(image.ImageError) as info:
        log.run("base: debootstrap", ["false", "bookworm", "http://mirror.example/debian"])
    assert "mirror.example" not in str(info.value)
    assert "<mirror>" in str(info.value)
    assert "mirror.example" not in (tmp_path / "x.log").read_text()


def test_prune_drops_older_builds_only(cache: Path, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    plan = image.planned_images(make_context(tmp_path / "ctx"))
    key = plan.unwind.key[:12]
    calls: list[list[str]] = []

    def fake_run(cmd: list[str], **kwargs: Any) -> Any:
        calls.append(cmd[7:])  # after buildah --root R --runroot RR --storage-driver vfs
        listing = (f"localhost/unwind:{key}\nlocalhost/unwind:dev\nlocalhost/unwind:0123456789ab\n"
                   "docker.io/library/unwind:dev\nlocalhost/python:3.11-debian-0123456789ab\n"
                   "localhost/unwind:notahexkey12\n<none>:<none>\n")
        return subprocess.CompletedProcess(cmd, 0, listing if cmd[7] == "images" else "", None)

    monkeypatch.setattr(subprocess, "run", fake_run)
    image._prune_storage(image._Log(tmp_path / "log"), plan.unwind)
    assert calls[1:] == [["rmi", "localhost/unwind:0123456789ab"], ["rmi", "--prune"]]


def test_archives_keep_the_current_and_the_previous(cache: Path, tmp_path: Path) -> None:
    import os
    plan = image.planned_images(make_context(tmp_path / "ctx"))
    d = cache / "images"
    d.mkdir(parents=True)
    for age, key in enumerate(["new", "old", "older"], start=1):
        (d / f"unwind-{key}.tar").write_bytes(b"x")
        (d / f"unwind-{key}.json").write_text("{}")
        os.utime(d / f"unwind-{key}.tar", (1000 - age, 1000 - age))
    plan.unwind.tar.write_bytes(b"current")
    (d / "pause-x.tar").write_bytes(b"other name")
    image._prune_archives(plan.unwind)
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [plan.unwind.tar.name, "unwind-new.tar", "unwind-new.json", "pause-x.tar"])


@pytest.mark.parametrize(("stdout", "rc", "found"), [
    (json.dumps({"OCIv1": {"config": {"Labels": {image.KEY_LABEL: "k1"}}}}), 0, True),
    (json.dumps({"OCIv1": {"config": {"Labels": {image.KEY_LABEL: "k0"}}}}), 0, False),
    (json.dumps({"OCIv1": {"config": {}}}), 0, False),
    ("", 125, False),
    ("not json", 0, False),
])
def test_base_in_storage_is_read_from_its_label(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                stdout: str, rc: int, found: bool) -> None:
    monkeypatch.setattr(subprocess, "run",
                        lambda cmd, **kw: subprocess.CompletedProcess(cmd, rc, stdout, ""))
    assert image._in_storage(image._Log(tmp_path / "log"), image.BASE_IMAGE, "k1") is found


def test_stale_work_directories_are_removed(cache: Path) -> None:
    (cache / "images" / "tmp-base-x" / "rootfs").mkdir(parents=True)
    (cache / "images" / "tmp-unwind-1.tar").write_bytes(b"half")
    (cache / "images" / "unwind-abc.tar").write_bytes(b"kept")
    image._clean_stale()
    assert [p.name for p in (cache / "images").iterdir()] == ["unwind-abc.tar"]


# --- containerd import -------------------------------------------------------------------

def docker_archive(path: Path, tags: list[str], config: bytes = b'{"architecture":"amd64"}') -> str:
    import hashlib
    digest = hashlib.sha256(config).hexdigest()
    with tarfile.open(path, "w") as tf:
        for name, data in ((f"{digest}.json", config),
                           ("manifest.json", json.dumps([{"Config": f"{digest}.json",
                                                          "RepoTags": tags, "Layers": []}]).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


@pytest.mark.parametrize(("ref", "normal"), [
    ("unwind:dev", "docker.io/library/unwind:dev"),
    ("docker.io/library/unwind:dev", "docker.io/library/unwind:dev"),
    ("localhost/unwind-pause:1", "localhost/unwind-pause:1"),
    ("localhost:5000/a/b", "localhost:5000/a/b:latest"),
    ("me/tool", "docker.io/me/tool:latest"),
])
def test_normalize_ref(ref: str, normal: str) -> None:
    assert imageimport.normalize_ref(ref) == normal


class FakeCtr:
    def __init__(self, images: dict[str, tuple[str, str]]) -> None:
        self.images = images  # ref -> (manifest digest, config digest)
        self.calls: list[list[str]] = []

    def __call__(self, cmd: list[str], **kwargs: Any) -> Any:
        self.calls.append(cmd)
        assert cmd[:5] == ["ctr", "--address", "/run/c.sock", "-n", "k8s.io"]
        rest = cmd[5:]
        if rest == ["images", "ls"]:
            lines = ["REF TYPE DIGEST SIZE PLATFORMS LABELS"] + [
                f"{r} application/vnd.docker.distribution.manifest.v2+json {m} 1.0 MiB linux/amd64 -"
                for r, (m, _) in self.images.items()]
            return subprocess.CompletedProcess(cmd, 0, "\n".join(lines) + "\n", "")
        if rest[:2] == ["content", "get"]:
            for m, c in self.images.values():
                if m == rest[2]:
                    return subprocess.CompletedProcess(
                        cmd, 0, json.dumps({"config": {"digest": c}}).encode(), b"")
            return subprocess.CompletedProcess(cmd, 1, b"", b"not found")
        if rest[:2] == ["images", "import"]:
            return subprocess.CompletedProcess(cmd, 0, None, None)
        raise AssertionError(cmd)


def test_import_skips_what_containerd_has(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    have = tmp_path / "have.tar"
    have_cfg = docker_archive(have, ["docker.io/library/unwind:dev", "localhost/unwind:dev"])
    stale = tmp_path / "stale.tar"
    docker_archive(stale, ["localhost/unwind-pause:1"], b'{"new": 1}')
    fake = FakeCtr({
        "docker.io/library/unwind:dev": ("sha256:m1", have_cfg),
        "localhost/unwind:dev": ("sha256:m1", have_cfg),
        "localhost/unwind-pause:1": ("sha256:m2", "sha256:old"),
    })
    monkeypatch.setattr(subprocess, "run", fake)
    got = imageimport.import_images("/run/c.sock", [have, stale], log=tmp_path / "import.log")
    assert got == [stale]
    imports = [c for c in fake.calls if c[5:7] == ["images", "import"]]
    assert imports == [["ctr", "--address", "/run/c.sock", "-n", "k8s.io", "images", "import",
                        str(stale)]]


def test_import_when_a_tag_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tar = tmp_path / "u.tar"
    cfg = docker_archive(tar, ["docker.io/library/unwind:dev", "localhost/unwind:abc"])
    fake = FakeCtr({"docker.io/library/unwind:dev": ("sha256:m1", cfg)})
    monkeypatch.setattr(subprocess, "run", fake)
    assert imageimport.import_images("/run/c.sock", [tar], log=tmp_path / "import.log") == [tar]


def test_import_accepts_images(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = image.planned_images(make_context(tmp_path / "ctx"))
    plan.unwind.tar.parent.mkdir(parents=True)
    docker_archive(plan.unwind.tar, list(plan.unwind.tags))
    docker_archive(plan.pause.tar, list(plan.pause.tags))
    fake = FakeCtr({})
    monkeypatch.setattr(subprocess, "run", fake)
    got = imageimport.import_images("/run/c.sock", plan, snapshotter="overlayfs")
    assert got == [plan.unwind.tar, plan.pause.tar]
    assert next(c for c in fake.calls if "import" in c)[7:9] == ["--snapshotter", "overlayfs"]


def test_archive_info_reads_tags_and_config(tmp_path: Path) -> None:
    tar = tmp_path / "a.tar"
    cfg = docker_archive(tar, ["localhost/x:1"])
    assert imageimport.archive_info(tar) == (["localhost/x:1"], cfg)


def test_main_prints_refs_and_tars(cache: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    plan = image.planned_images()
    monkeypatch.setattr(image, "ensure_images", lambda: plan)
    assert image.main([]) == 0
    out = capsys.readouterr().out
    assert "unwind_image=docker.io/library/unwind:dev\n" in out
    assert "pause_image=localhost/unwind-pause:1\n" in out
    assert f"unwind_tar={plan.unwind.tar}\n" in out
    assert image.main(["--print-tars"]) == 0
    assert capsys.readouterr().out.split() == [str(plan.unwind.tar), str(plan.pause.tar)]


def test_main_reports_an_error(cache: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    def fail() -> image.Images:
        raise image.ImageError("step 'x' failed; see log /l")

    monkeypatch.setattr(image, "ensure_images", fail)
    assert image.main([]) == 1
    assert "see log /l" in capsys.readouterr().err



# Programs image.py runs that every Debian machine has (or that come with a listed package).
_BASE_SYSTEM = {"umount": "mount", "chroot": "coreutils", "tar": "tar", "ctr": "containerd"}


def _programs_run(source: str) -> set[str]:
    """The first word of every argv written as a list literal and given to a ``.run(...)``
    (``log.run(step, [...])`` or ``subprocess.run([...])``)."""
    import ast

    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "run":
            for arg in node.args[:2]:
                if isinstance(arg, ast.List) and arg.elts and isinstance(arg.elts[0], ast.Constant):
                    found.add(str(arg.elts[0].value))
    return found


def test_every_program_the_image_build_runs_is_installed_by_the_build() -> None:
    """A program missing from the install table works on a machine that has it by hand and
    fails on a fresh one (skopeo did: 'could not start skopeo' on a clean machine)."""
    from unwind.controlplane.build import MACHINE_TOOLS, TOOL_PACKAGES

    programs = _programs_run((REPO / "operator/unwind/controlplane/image.py").read_text())
    assert {"skopeo", "debootstrap", "go"} <= programs  # the scan sees the build's commands
    missing = sorted(p for p in programs if p not in TOOL_PACKAGES and p not in _BASE_SYSTEM
                     and p not in MACHINE_TOOLS)
    assert missing == [], f"add these to build.TOOL_PACKAGES: {missing}"
