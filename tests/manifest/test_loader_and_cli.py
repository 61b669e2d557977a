"""Reading files, locating errors by line, and the CLI's output shapes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from unwind.cli.main import main
from unwind.manifest.loader import check_paths, load_text

ROOT = Path(__file__).resolve().parents[2]

RESOURCE = """\
apiVersion: unwind.dev/v1alpha1
kind: ToolManifest
metadata: {name: refund}
spec:
  tool: stripe.refund
  effect: idempotent
  permission: payments:write
  retry:
    attempts: 30
"""


def test_an_error_names_the_file_and_the_line_of_the_field(tmp_path: Path) -> None:
    path = tmp_path / "refund.yaml"
    path.write_text(RESOURCE)
    result = check_paths([path])
    assert [(i.tool, i.path, i.file, i.line) for i in result.issues] == [
        ("stripe.refund", "retry.attempts", str(path), 9)]


def test_bare_manifests_lists_and_multi_document_files_are_all_read() -> None:
    text = "tool: a\neffect: read_only\npermission: p\n---\n- {tool: b, effect: read_only, permission: p}\n"
    loaded = load_text(text + "---\n" + RESOURCE.replace("attempts: 30", "attempts: 3"), "f.yaml")
    assert [i.data["tool"] for i in loaded.items] == ["a", "b", "stripe.refund"]
    assert [i.line for i in loaded.items] == [1, 5, 10]  # a resource: the line of spec:


def test_other_kubernetes_resources_beside_manifests_are_ignored() -> None:
    loaded = load_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n", "ns.yaml")
    assert loaded.items == [] and loaded.errors == []


def test_a_toolmanifest_with_the_wrong_api_version_is_refused() -> None:
    loaded = load_text(RESOURCE.replace("unwind.dev/v1alpha1", "unwind.dev/v1"), "f.yaml")
    assert "needs apiVersion: unwind.dev/v1alpha1" in loaded.errors[0].message


def test_a_yaml_syntax_error_is_one_line_with_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("tool: a\neffect: [read_only\npermission: p\n")
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith(f"error: {bad}:") and "YAML syntax error" in err[0]
    assert "Traceback" not in "\n".join(err)


def test_a_missing_path_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "/nonexistent/manifests"]) == 1
    assert "no such file or folder" in capsys.readouterr().err


def test_validate_prints_the_success_line_for_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", str(ROOT / "manifests")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "ok: 13 tool manifests valid (code-hosting: 10, payments: 3)",
        "not checked (1 file holding no tool manifest):",
        f"  {ROOT / 'manifests' / '00-namespaces.yaml'}: Kubernetes Namespace 'payments': not a "
        "ToolManifest; Kubernetes Namespace 'code-hosting': not a ToolManifest"]


def test_validate_json_has_the_documented_shape(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "refund.yaml"
    path.write_text(RESOURCE)
    assert main(["validate", "--json", str(path)]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out == {"ok": False, "count": 0, "read": 1, "files": 1, "namespaces": [],
                   "checked": {"tool_manifests": 1}, "skipped": [], "errors": [{
                       "tool": "stripe.refund", "path": "retry.attempts",
                       "message": "input should be less than or equal to 10 (got 30)",
                       "file": str(path), "line": 9}]}


def test_set_level_errors_carry_their_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("- tool: a\n  effect: compensable\n  permission: p\n  compensation:\n    tool: gone\n")
    assert main(["validate", "--json", str(path)]) == 1
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert [(e["path"], e["line"]) for e in errors] == [("compensation.tool", 5)]


def test_the_committed_json_schema_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == (ROOT / "schemas" / "manifest.schema.json").read_text()


def test_the_committed_crds_and_the_charts_copy_are_what_the_generator_writes(tmp_path: Path) -> None:
    assert main(["crds", "--out", str(tmp_path)]) == 0
    for generated in sorted(tmp_path.iterdir()):
        for folder in ("crds", "charts/unwind/crds"):
            committed = ROOT / folder / generated.name
            assert committed.read_text() == generated.read_text(), (
                f"{committed} is stale: run `unwind crds` and commit")


def test_the_example_contract_tests_pass_and_cover_every_example_tool(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["test", str(ROOT / "tests" / "contracts"), "-m", str(ROOT / "manifests"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["failed"] == 0 and report["passed"] >= 20
    assert report["not_covered"] == []


def test_the_examples_lint_clean_under_strict(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["lint", "--strict", "--json", str(ROOT / "manifests")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["findings"], report["errors"], report["warnings"], report["notes"]) == ([], 0, 0, 0)


def test_lint_json_reports_findings_with_their_levels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("- {tool: a.write, effect: idempotent, permission: p}\n")
    assert main(["lint", "--json", "--strict", str(path)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {"code": "L011", "level": "warning", "tool": "a.write", "path": "owner", "file": str(path),
            "line": 1, "message": report["findings"][1]["message"]} in report["findings"]
    assert report["errors"] == 0 and report["warnings"] >= 2


def test_a_duplicate_tool_is_reported_where_the_second_declaration_is(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "one.yaml").write_text("tool: a\neffect: read_only\npermission: p\n")
    (tmp_path / "two.yaml").write_text("# again\ntool: a\neffect: read_only\npermission: q\n")
    assert main(["validate", "--json", str(tmp_path)]) == 1
    errors = json.loads(capsys.readouterr().out)["errors"]
    assert [(e["file"], e["line"], e["path"]) for e in errors] == [(str(tmp_path / "two.yaml"), 2, "tool")]
