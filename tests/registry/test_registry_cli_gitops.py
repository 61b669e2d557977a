"""The registry commands as a CI job runs them: re-runs are harmless, every answer says
what is enforced, and with a trusted key nothing unsigned is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unwind.cli.main import main

REPO = Path(__file__).resolve().parents[2]
PAYMENTS = str(REPO / "manifests" / "payments.yaml")


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    for name in ("UNWIND_MANIFEST_PUBLIC_KEY", "UNWIND_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("USER", "alice")
    return tmp_path


def unwind(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def versions(capsys: pytest.CaptureFixture[str], tool: str) -> list[int]:
    code, out, _ = unwind(capsys, "manifests", "history", tool, "--json")
    assert code == 0
    return [r["version"] for r in json.loads(out)]


def test_publishing_the_same_files_again_after_an_approval_makes_no_new_version(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unwind(capsys, "manifests", "publish", PAYMENTS)
    assert unwind(capsys, "manifests", "approve", "stripe.refund", "--by", "bob")[0] == 0
    code, out, _ = unwind(capsys, "manifests", "publish", PAYMENTS, "--json")
    assert code == 0 and {r["changed"] for r in json.loads(out)} == {False}
    assert versions(capsys, "stripe.refund") == [1, 2]
    code, out, _ = unwind(capsys, "manifests", "publish", PAYMENTS)
    assert "stripe.refund  v2  approved  " in out and out.count("unchanged") == 3


def test_publishing_approved_content_again_as_approved_after_a_draft_is_a_new_version(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unwind(capsys, "manifests", "publish", PAYMENTS)
    code, out, _ = unwind(capsys, "manifests", "publish", PAYMENTS, "--status", "approved")
    assert code == 0 and out.count("  approved  ") == 3 and "unchanged" not in out
    assert versions(capsys, "stripe.refund") == [1, 2]


def test_a_rollback_to_a_draft_says_which_version_stays_enforced(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unwind(capsys, "manifests", "publish", PAYMENTS)
    unwind(capsys, "manifests", "approve", "stripe.refund", "--by", "bob")
    (workdir / "refund.yaml").write_text(
        "tool: stripe.refund\neffect: idempotent\npermission: payments:refund\n")
    unwind(capsys, "manifests", "publish", "refund.yaml")  # v3, a draft
    code, out, _ = unwind(capsys, "manifests", "rollback", "stripe.refund", "v1")
    assert code == 0
    assert out.startswith("stripe.refund  v4  draft  ")
    assert out.rstrip().endswith("rolled back to v1, a draft  (v2 stays enforced)")
    code, out, _ = unwind(capsys, "manifests", "rollback", "stripe.refund", "1", "--json")
    assert json.loads(out)[0]["enforced"] == 2


def test_a_rollback_when_nothing_is_approved_says_nothing_is_enforced(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unwind(capsys, "manifests", "publish", PAYMENTS)
    (workdir / "refund.yaml").write_text(
        "tool: stripe.refund\neffect: idempotent\npermission: payments:refund\n")
    unwind(capsys, "manifests", "publish", "refund.yaml")
    code, out, _ = unwind(capsys, "manifests", "rollback", "stripe.refund", "1")
    assert code == 0 and out.rstrip().endswith("  (not enforced: no approved version)")


@pytest.mark.parametrize("how", ["env", "config", "flag"])
def test_with_a_trusted_key_an_unsigned_write_is_refused_before_anything_is_written(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    assert unwind(capsys, "keygen", "keys/mf")[0] == 0
    extra: list[str] = []
    if how == "env":
        monkeypatch.setenv("UNWIND_MANIFEST_PUBLIC_KEY", "keys/mf.pub")
    elif how == "config":
        (workdir / "unwind.yaml").write_text("manifest_public_key: keys/mf.pub\n")
    else:
        extra = ["--trust", "keys/mf.pub"]
    code, out, err = unwind(capsys, "manifests", "publish", PAYMENTS, *extra)
    assert (code, out) == (1, "")
    assert err.startswith("error: a trusted key is set (1 key), so every reader would refuse "
                          "an unsigned version")
    assert not (workdir / "registry" / "tools").exists()
    code, out, _ = unwind(capsys, "manifests", "publish", PAYMENTS, "--key", "keys/mf.key", *extra)
    assert code == 0 and out.count("  draft  ") == 3


def test_the_signing_key_may_come_from_unwind_yaml_or_the_environment(
        workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    unwind(capsys, "keygen", "keys/mf")
    (workdir / "unwind.yaml").write_text("manifest_public_key: keys/mf.pub\nsigning_key: keys/mf.key\n")
    assert unwind(capsys, "manifests", "publish", PAYMENTS)[0] == 0
    (workdir / "unwind.yaml").write_text("manifest_public_key: keys/mf.pub\n")
    monkeypatch.setenv("UNWIND_SIGNING_KEY", "keys/mf.key")
    assert unwind(capsys, "manifests", "approve", "stripe.refund", "--by", "bob")[0] == 0
    code, out, _ = unwind(capsys, "manifests", "verify")
    assert code == 0 and out.startswith("ok: 4 versions checked, signatures checked against 1 "
                                        "trusted key")


def test_keygen_takes_a_base_name_and_does_not_double_the_suffix(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, _ = unwind(capsys, "keygen", "keys/bob.key")
    assert code == 0 and (workdir / "keys" / "bob.key").is_file() and (workdir / "keys" / "bob.pub").is_file()
    assert not (workdir / "keys" / "bob.key.key").exists()
    code, _, err = unwind(capsys, "keygen", "keys/bob")
    assert code == 1 and "keys/bob.key already exists" in err


def test_approve_takes_several_tools_and_approves_each_after_the_tools_it_names(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    unwind(capsys, "manifests", "publish", PAYMENTS)
    code, out, err = unwind(capsys, "manifests", "approve", "stripe.create_charge",
                            "stripe.get_charge", "stripe.refund", "--by", "bob")
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()] == [
        "stripe.get_charge", "stripe.refund", "stripe.create_charge"]
    code, out, err = unwind(capsys, "manifests", "approve", "stripe.refund", "stripe.get_charge",
                            "--version", "1", "--by", "bob")
    assert code == 1 and "--version names one draft" in err


def test_a_missing_registry_says_so_rather_than_that_the_tool_is_unknown(
        workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = unwind(capsys, "manifests", "history", "stripe.refund", "--registry", "nowhere")
    assert code == 1 and err.startswith("error: no registry at nowhere/index.json")


def test_a_version_is_accepted_with_or_without_its_v(workdir: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    unwind(capsys, "manifests", "publish", PAYMENTS)
    assert unwind(capsys, "manifests", "approve", "stripe.refund", "--version", "v1", "--by", "bob")[0] == 0
    with pytest.raises(SystemExit) as exit_:
        main(["manifests", "rollback", "stripe.refund", "version1"])
    assert exit_.value.code == 2
    assert "'version1' is not a version: write 2 or v2" in capsys.readouterr().err
