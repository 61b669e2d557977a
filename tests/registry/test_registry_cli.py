"""The registry commands as a person runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .cli import run

REPO = Path(__file__).resolve().parents[2]
PAYMENTS = str(REPO / "manifests" / "payments.yaml")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("UNWIND_MANIFEST_PUBLIC_KEY", raising=False)
    monkeypatch.setenv("USER", "alice")
    return tmp_path


def test_the_walkthrough_publish_approve_history_verify(workdir: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "keygen", "keys/mf")
    assert code == 0 and "keys/mf.key" in out and "key id" in out
    code, out, _ = run(capsys, "manifests", "publish", PAYMENTS, "--registry", "reg",
                       "--key", "keys/mf.key", "--note", "first draft")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3 and all(line.split()[1:3] == ["v1", "draft"] for line in lines)
    assert any(line.startswith("stripe.get_charge  v1  draft  ") for line in lines)
    for tool in ("stripe.get_charge", "stripe.refund"):
        code, out, _ = run(capsys, "manifests", "approve", tool, "--registry", "reg", "--by",
                           "bob", "--key", "keys/mf.key", "--four-eyes")
        assert (code, out) == (0, f"{tool}  v2  approved by bob  (enforced)\n")
    code, out, _ = run(capsys, "manifests", "history", "stripe.refund", "--registry", "reg")
    header, v1, v2, enforced = out.splitlines()
    assert header.split() == ["VERSION", "LIFECYCLE", "CREATED", "BY", "APPROVED", "BY", "CHECKSUM",
                              "SIGNED", "BY", "NOTE"]
    assert v1.split()[:2] == ["v1", "draft"] and v1.split()[3:5] == ["alice", "-"]
    assert v1.endswith("first draft") and v2.endswith("approved from v1")
    assert v2.split()[3:5] == ["alice", "bob"] and "unsigned" not in v2
    assert [line.index(word) for line, word in ((header, "CHECKSUM"), (v2, v2.split()[5]))] == \
        [header.index("CHECKSUM")] * 2  # columns line up under their header
    assert enforced == "enforced: v2"
    code, out, _ = run(capsys, "manifests", "verify", "--registry", "reg", "--trust", "keys/mf.pub")
    assert code == 0 and out.startswith("ok: 5 versions checked, signatures checked against 1")


def test_four_eyes_refusal_is_one_line_on_stderr(workdir: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "manifests", "publish", PAYMENTS, "--registry", "reg")
    code, out, err = run(capsys, "manifests", "approve", "stripe.refund", "--registry", "reg",
                         "--four-eyes")
    assert code == 1 and out == ""
    assert err.startswith("error: stripe.refund v1 was written by alice") and err.count("\n") == 1


def test_the_registry_defaults_to_manifests_in_unwind_yaml(workdir: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (workdir / "unwind.yaml").write_text("manifests: store\n")
    assert run(capsys, "manifests", "publish", PAYMENTS, "--status", "approved")[0] == 0
    assert (workdir / "store" / "index.json").is_file()
    code, out, _ = run(capsys, "manifests", "list", "--json")
    listed = json.loads(out)
    assert code == 0 and {e["enforced"] for e in listed} == {1}


def test_without_config_the_registry_is_the_registry_folder(workdir: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "manifests", "publish", PAYMENTS)[0] == 0
    assert (workdir / "registry" / "index.json").is_file()
    code, out, _ = run(capsys, "manifests", "list")
    assert code == 0 and out.splitlines()[0].split() == ["TOOL", "NEWEST", "LIFECYCLE", "CHECKSUM",
                                                        "ENFORCED"]
    refund = next(line for line in out.splitlines() if line.startswith("stripe.refund"))
    assert refund.split()[1:3] == ["v1", "draft"] and refund.endswith("none (draft only)")


def test_deprecate_rollback_and_diff(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "manifests", "publish", PAYMENTS, "--status", "approved")
    code, out, _ = run(capsys, "manifests", "deprecate", "stripe.refund", "--by", "carol")
    assert code == 0 and out.startswith("stripe.refund  v2  deprecated  ")
    code, out, _ = run(capsys, "manifests", "rollback", "stripe.refund", "1")
    assert code == 0 and out.startswith("stripe.refund  v3  approved  ") and "rolled back to v1" in out
    code, out, _ = run(capsys, "manifests", "diff", "stripe.refund", "1", "v2")
    assert code == 1 and '+  "lifecycle": "deprecated",' in out  # like diff(1): 1 when they differ
    code, out, _ = run(capsys, "manifests", "diff", "stripe.refund", "v1", "3")
    assert code == 1 and '-  "version": 1' in out
    code, out, _ = run(capsys, "manifests", "diff", "stripe.refund", "2", "2")
    assert (code, out) == (0, "stripe.refund v2 and v2 are the same manifest\n")
    code, _, err = run(capsys, "manifests", "diff", "stripe.refund", "1", "9")
    assert code == 2 and "stripe.refund has no version 9 (it has v1 to v3)" in err
    code, _, err = run(capsys, "manifests", "deprecate", "stripe.refund", "--replaced-by", "nope")
    assert code == 1 and err == ("error: stripe.refund cannot be replaced by nope: it has no "
                                 "approved version in the registry\n")


def test_publish_json_reports_each_version(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "manifests", "publish", PAYMENTS)
    code, out, _ = run(capsys, "manifests", "publish", PAYMENTS, "--json")
    assert code == 0 and {r["changed"] for r in json.loads(out)} == {False}


def test_check_validates_plain_files(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "manifests", "check", PAYMENTS) == (0, "ok: 3 tool manifests valid in namespace payments\n", "")
    (workdir / "bad.yaml").write_text("tool: x\neffect: sideways\npermission: p\n")
    code, _, err = run(capsys, "manifests", "check", "bad.yaml")
    assert code == 1 and err.startswith("error: bad.yaml:2: x: effect:")


def test_a_missing_key_file_is_an_error_line_not_a_traceback(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "manifests", "publish", PAYMENTS, "--key", "nokey.key")
    assert code == 1 and err.startswith("error: cannot read the private key nokey.key")
    code, _, err = run(capsys, "manifests", "verify")
    assert code == 1 and err.startswith("error: no registry at registry/index.json")
