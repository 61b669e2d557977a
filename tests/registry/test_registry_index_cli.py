"""The signed index as a person meets it through `unwind manifests`: a cut-back index, an
index from before signing, an expired one, an older one served again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .cli import run
from .tls import Server, Tls

TOOL = "stripe.refund"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("UNWIND_MANIFEST_PUBLIC_KEY", raising=False)
    monkeypatch.setenv("USER", "alice")
    assert run(capsys, "keygen", "keys/mf")[0] == 0
    return tmp_path


def _publish(capsys: pytest.CaptureFixture[str], registry: str, permission: str,
             *extra: str) -> None:
    Path("m.yaml").write_text(f"tool: {TOOL}\neffect: idempotent\npermission: {permission}\n")
    code, _, err = run(capsys, "manifests", "publish", "m.yaml", "--registry", registry,
                       "--status", "approved", "--key", "keys/mf.key", *extra)
    assert code == 0, err


def _verify(capsys: pytest.CaptureFixture[str], registry: str, *extra: str) -> tuple[int, str, str]:
    return run(capsys, "manifests", "verify", "--registry", registry, "--trust", "keys/mf.pub",
               *extra)


def test_cutting_a_tools_version_list_back_to_an_older_signed_version_fails_verify(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _publish(capsys, "reg", "payments:refund")
    _publish(capsys, "reg", "payments:refund-limited")
    index = json.loads(Path("reg/index.json").read_text())
    index["tools"][TOOL] = index["tools"][TOOL][:1]  # v1 is validly signed on its own
    Path("reg/index.json").write_text(json.dumps(index))
    code, _, err = _verify(capsys, "reg")
    assert code == 1
    assert "reg/index.json: the index's signature does not verify" in err
    assert f"error: {TOOL} v2 (reg/tools/stripe%2Erefund/v2.json): the file is present but " \
           "index.json does not list this version" in err
    code, out, _ = run(capsys, "manifests", "verify", "--registry", "reg", "--json",
                       "--trust", "keys/mf.pub")
    report = json.loads(out)
    assert code == 1 and [(p["tool"], p["version"], p["code"]) for p in report["problems"]] == [
        (None, None, "bad_index_signature"), (TOOL, 2, "unlisted_version")]


def test_a_registry_from_before_signed_indexes_is_told_the_command_that_signs_it(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _publish(capsys, "reg", "payments:refund")
    index = json.loads(Path("reg/index.json").read_text())
    old = {"format": index["format"], "tools": index["tools"]}  # as written before this change
    Path("reg/index.json").write_text(json.dumps(old))
    code, _, err = _verify(capsys, "reg")
    assert code == 1
    assert "the index is not signed, and a trusted key is set" in err
    assert "`unwind manifests sign-index --registry reg --key KEY`" in err
    code, out, _ = run(capsys, "manifests", "verify", "--registry", "reg")
    assert code == 0 and "index: generation 0, not signed" in out and "sign-index" in out
    code, out, _ = run(capsys, "manifests", "sign-index", "--registry", "reg", "--key", "keys/mf.key")
    assert code == 0 and out.startswith("signed reg/index.json: generation 1, signed by ")
    code, out, _ = _verify(capsys, "reg")
    assert code == 0 and "\nindex: generation 1, signed by " in out


def test_an_expired_index_fails_verify_until_it_is_signed_again(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _publish(capsys, "reg", "payments:refund", "--index-ttl", "1ms")  # expired at once
    code, _, err = _verify(capsys, "reg")
    assert code == 1 and "the index expired at " in err and "sign-index" in err
    code, out, _ = run(capsys, "manifests", "sign-index", "--registry", "reg", "--key",
                       "keys/mf.key", "--index-ttl", "2d")
    assert code == 0 and "re-sign it soon" in out  # two days left: the line warns
    assert _verify(capsys, "reg")[0] == 0


def test_an_index_ttl_that_is_not_a_positive_duration_is_refused(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for ttl, message in (("0s", "must be longer than 0"), ("soon", "is not a duration"),
                         ("30", "give '30' a unit, such as 30d or 12h")):
        Path("m.yaml").write_text(f"tool: {TOOL}\neffect: idempotent\npermission: p\n")
        code, _, err = run(capsys, "manifests", "publish", "m.yaml", "--registry", "reg",
                           "--key", "keys/mf.key", "--index-ttl", ttl)
        assert code == 1 and message in err and err.count("\n") == 1


def test_a_write_without_a_key_to_a_signed_registry_is_one_error_line(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _publish(capsys, "reg", "payments:refund")
    code, _, err = run(capsys, "manifests", "deprecate", TOOL, "--registry", "reg")
    assert code == 1 and err.startswith("error: reg/index.json is signed (key ")
    assert "pass --key" in err and err.count("\n") == 1


def test_a_floor_given_with_min_generation_refuses_an_older_index(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _publish(capsys, "reg", "payments:refund")
    assert _verify(capsys, "reg", "--min-generation", "1")[0] == 0
    code, _, err = _verify(capsys, "reg", "--min-generation", "9")
    assert code == 1 and "generation 1, lower than generation 9 accepted before (the " \
        "--min-generation given)" in err


def test_an_https_registry_served_at_an_older_generation_is_refused_by_the_next_verify(
        workdir: Path, capsys: pytest.CaptureFixture[str], https_server: Server, tls: Tls,
        private_cache: Path) -> None:
    folder = https_server.root / f"replay-{workdir.name}"
    _publish(capsys, str(folder), "payments:refund")
    shutil.copy(folder / "index.json", workdir / "old-index.json")  # kept by an attacker
    _publish(capsys, str(folder), "payments:refund-limited")
    url = f"{https_server.base_url}/{folder.name}"
    https = ("--ca-file", str(tls.ca_file))
    assert _verify(capsys, url, *https)[0] == 0
    state = private_cache / "unwind" / "registry-generations.json"
    assert json.loads(state.read_text()) == {f"{url}/index.json": 2}
    shutil.copy(workdir / "old-index.json", folder / "index.json")  # the old copy served
    code, _, err = _verify(capsys, url, *https)
    assert code == 1 and "the index has generation 1, lower than generation 2 accepted " \
        f"before (recorded in {state}" in err
    assert _verify(capsys, url, *https, "--no-generation-state")[0] == 0  # on purpose
    # A folder keeps no state unless asked (going back in git is normal there), but it
    # can be listed: the version file the old index leaves out is reported.
    code, _, err = _verify(capsys, str(folder))
    assert code == 1 and "lower than generation" not in err
    assert f"{TOOL} v2 (" in err and "does not list this version" in err
