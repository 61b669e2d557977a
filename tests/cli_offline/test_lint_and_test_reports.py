"""`unwind lint` and `unwind test` in CI: findings and failures on their file and line,
silencing with a reason, JUnit and SARIF for the CI system to annotate."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

from .conftest import REPO, Run

WRITE = """\
apiVersion: unwind.dev/v1alpha1
kind: ToolManifest
metadata:
  name: cancel
  namespace: shop
{annotations}spec:
  tool: shop.cancel_order
  effect: idempotent
  permission: shop:write
  description: Cancel one order.
  owner: [shop-team]
  risk:
    blast_radius: low
"""


def write(root: Path, annotations: str = "") -> None:
    (root / "m.yaml").write_text(WRITE.format(annotations=annotations))


def test_a_finding_carries_its_file_line_and_field(project: Path, unwind: Run) -> None:
    write(project)
    code, out, _ = unwind("lint", "m.yaml")
    assert code == 0
    assert out.splitlines() == [
        "m.yaml:12: warning L012  shop.cancel_order: risk.data_class: no risk.data_class: policy "
        "and retention cannot treat sensitive data differently; add risk: {data_class: pii, "
        "financial, ...}",
        "m.yaml:6: info    L022  shop.cancel_order: timeout_ms: no timeout_ms: a hung call is only "
        "bounded by the gateway default; set timeout_ms to the longest the upstream may take",
        "0 errors, 1 warning, 1 note"]
    code, out, _ = unwind("lint", "m.yaml", "--json")
    finding = json.loads(out)["findings"][0]
    assert (finding["file"], finding["line"], finding["path"]) == ("m.yaml", 12, "risk.data_class")


def test_disable_silences_a_code_for_the_run_and_still_lists_it(project: Path, unwind: Run) -> None:
    write(project)
    assert unwind("lint", "--strict", "m.yaml")[0] == 1
    code, out, _ = unwind("lint", "--strict", "m.yaml", "--disable", "l012,L022")
    assert code == 0 and out == "0 errors, 0 warnings, 0 notes; 2 silenced (listed with -o json)\n"
    code, out, _ = unwind("lint", "--strict", "m.yaml", "--disable", "L012", "--json")
    doc = json.loads(out)
    assert code == 0 and [(s["code"], s["reason"]) for s in doc["silenced"]] == [("L012", "--disable")]


def test_an_annotation_silences_one_code_for_one_manifest_with_its_reason(project: Path,
                                                                          unwind: Run) -> None:
    write(project, "  annotations:\n    ignore-check.unwind.dev/L012: \"holds no customer data\"\n")
    code, out, _ = unwind("lint", "--strict", "m.yaml", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["warnings"] == 0
    assert [(s["code"], s["reason"]) for s in doc["silenced"]] == [("L012", "holds no customer data")]


def test_an_annotation_without_a_reason_or_with_an_unknown_code_is_an_error(project: Path,
                                                                            unwind: Run) -> None:
    write(project, "  annotations:\n    ignore-check.unwind.dev/L012: \"\"\n"
                   "    ignore-check.unwind.dev/L099: why not\n")
    code, _, err = unwind("lint", "m.yaml")
    assert code == 1
    assert "m.yaml:7: shop.cancel_order: metadata.annotations.ignore-check.unwind.dev/L012: say " \
           "why the finding is accepted" in err
    assert "'L099' is not a lint code" in err


def test_lint_junit_has_one_case_per_tool_failing_on_what_fails_the_run(project: Path,
                                                                       unwind: Run) -> None:
    write(project)
    code, out, _ = unwind("lint", "--strict", "m.yaml", "-o", "junit")
    assert code == 1
    root = ET.fromstring(out)
    (case,) = root.iter("testcase")
    assert case.get("name") == "shop.cancel_order" and case.get("file") == "m.yaml"
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "L012"
    assert "L022" in (case.findtext("system-out") or "")  # a note does not fail the case
    assert root.get("failures") == "1"


def test_lint_sarif_puts_each_finding_on_its_line_and_marks_silenced_ones(project: Path,
                                                                         unwind: Run) -> None:
    write(project, "  annotations:\n    ignore-check.unwind.dev/L022: the upstream times out itself\n")
    code, out, _ = unwind("lint", "m.yaml", "-o", "sarif")
    assert code == 0
    run = json.loads(out)["runs"][0]
    assert run["tool"]["driver"]["name"] == "unwind"
    assert {r["id"] for r in run["tool"]["driver"]["rules"]} >= {"L012", "L022"}
    by_rule = {r["ruleId"]: r for r in run["results"]}
    region = by_rule["L012"]["locations"][0]["physicalLocation"]
    assert region == {"artifactLocation": {"uri": "m.yaml"}, "region": {"startLine": 14}}
    assert by_rule["L022"]["suppressions"] == [{"kind": "inSource",
                                                "justification": "the upstream times out itself"}]


def test_invalid_manifests_are_reported_in_every_format(project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text("tool: a\neffect: sideways\npermission: p\n")
    for fmt, parse in (("junit", ET.fromstring), ("sarif", json.loads), ("json", json.loads)):
        code, out, err = unwind("lint", "m.yaml", "-o", fmt)
        assert code == 1 and "m.yaml:2: a: effect:" in err
        assert parse(out) is not None, fmt


def contracts(root: Path, case: str) -> None:
    shutil.copytree(REPO / "manifests", root / "manifests")
    (root / "t.test.yaml").write_text(case)


CASE = """\
tests:
  - name: the refund takes the charge id
    tool: stripe.create_charge
    args: {order_id: o1, amount: 2500}
    result: {id: ch_1}
    expect_handle:
      charge_id: ch_9
      amount: 2500
"""


def test_a_failing_case_names_the_file_line_and_the_keys_that_differ(project: Path,
                                                                    unwind: Run) -> None:
    contracts(project, CASE)
    code, out, _ = unwind("test", "t.test.yaml", "-m", "manifests")
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "FAIL the refund takes the charge id (t.test.yaml:2)"
    assert lines[1].startswith("  t.test.yaml:6: expect_handle: the undo arguments are ")
    assert lines[1].endswith(': charge_id is "ch_1", expected "ch_9"')


def test_test_junit_and_sarif_locate_the_failed_expectation(project: Path, unwind: Run) -> None:
    contracts(project, CASE)
    code, out, _ = unwind("test", "t.test.yaml", "-m", "manifests", "-o", "junit")
    assert code == 1
    root = ET.fromstring(out)
    case = next(c for c in root.iter("testcase") if c.find("failure") is not None)
    assert (case.get("file"), case.get("line")) == ("t.test.yaml", "2")
    skipped = [c.get("name") for c in root.iter("testcase") if c.find("skipped") is not None]
    assert "github.get_issue" in skipped  # tools no case calls are listed, not hidden
    code, out, _ = unwind("test", "t.test.yaml", "-m", "manifests", "-o", "sarif")
    (result,) = json.loads(out)["runs"][0]["results"]
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 6}
    assert result["properties"]["field"] == "expect_handle"


def test_test_with_no_case_found_is_not_a_silent_pass(project: Path, unwind: Run) -> None:
    contracts(project, "")
    (project / "empty").mkdir()
    code, _, err = unwind("test", "empty", "-m", "manifests")
    assert code == 1 and "no contract test case found in empty" in err
    assert unwind("test", "empty", "-m", "manifests", "--allow-empty")[0] == 0


def test_files_in_a_test_folder_that_hold_no_case_are_listed_not_read_as_broken_tests(
        project: Path, unwind: Run) -> None:
    contracts(project, "")
    shutil.copytree(REPO / "tests" / "contracts", project / "suite")
    shutil.copy(REPO / "manifests" / "payments.yaml", project / "suite" / "fixture.yaml")
    code, out, err = unwind("test", "suite", "-m", "manifests")
    assert code == 0, err
    assert out.splitlines()[-2:] == ["not test files (1 file found in the folders given):",
                                     "  suite/fixture.yaml: holds tool manifests: not read as tests"]
    code, _, err = unwind("test", "suite/fixture.yaml", "-m", "manifests")  # named: read as tests
    assert code == 1 and "a test file holds a list of cases" in err


def test_a_bare_manifest_silences_a_code_with_a_comment_inside_it(project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(
        "- tool: shop.cancel_order\n"
        "  effect: idempotent\n"
        "  permission: shop:write\n"
        "  description: Cancel one order.\n"
        "  owner: [shop-team]\n"
        "  # ignore-check.unwind.dev/L012: holds no customer data\n"
        "  timeout_ms: 5s\n"
        "- {tool: shop.close_order, effect: idempotent, permission: shop:write, description: x,"
        " owner: [t], timeout_ms: 5s}\n")
    code, out, _ = unwind("lint", "--strict", "m.yaml", "--json")
    doc = json.loads(out)
    assert code == 1  # the second manifest is not silenced
    assert [(f["code"], f["tool"]) for f in doc["findings"]] == [("L012", "shop.close_order")]
    assert [(s["tool"], s["reason"]) for s in doc["silenced"]] == [("shop.cancel_order",
                                                                    "holds no customer data")]


def test_a_tool_declared_differently_in_two_namespaces_cannot_be_tested_without_a_guess(
        project: Path, unwind: Run) -> None:
    for ns, permission in (("one", "p:read"), ("two", "q:read")):
        (project / f"{ns}.yaml").write_text(
            "apiVersion: unwind.dev/v1alpha1\nkind: ToolManifest\n"
            f"metadata: {{name: get, namespace: {ns}}}\n"
            f"spec: {{tool: shop.get_order, effect: read_only, permission: {permission}}}\n")
    (project / "t.yaml").write_text("- {name: reads, tool: shop.get_order, expect_plan: skip}\n")
    code, _, err = unwind("test", "t.yaml", "-m", "one.yaml", "two.yaml")
    assert code == 1 and "shop.get_order: declared differently in one and two" in err
    assert unwind("test", "t.yaml", "-m", "one.yaml")[0] == 0
