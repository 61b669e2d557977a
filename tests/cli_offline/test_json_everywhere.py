"""With --json, stdout is exactly one JSON document, whatever happens: every command that
has --json, run on good input and on bad input, and its stdout parsed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from .conftest import REPO, Run

GOOD = "manifests"
BAD = "bad"


@pytest.fixture
def repo(project: Path, unwind: Run) -> Path:
    """manifests/ (valid), bad/ (invalid), tests/contracts/, a registry with a key."""
    shutil.copytree(REPO / "manifests", project / GOOD)
    shutil.copytree(REPO / "tests" / "contracts", project / "tests" / "contracts")
    (project / BAD).mkdir()
    (project / BAD / "m.yaml").write_text("tool: x\neffect: sideways\npermission: p\n")
    (project / "failing.test.yaml").write_text(
        "- {name: wrong plan, tool: stripe.get_charge, expect_plan: compensate}\n")
    assert unwind("keygen", "keys/mf")[0] == 0
    assert unwind("manifests", "publish", GOOD, "--key", "keys/mf.key")[0] == 0
    return project


CASES = [
    # (name, argv, exit code)
    ("validate good", ["validate", GOOD], 0),
    ("validate bad", ["validate", BAD], 1),
    ("validate missing path", ["validate", "nowhere"], 1),
    ("validate empty folder", ["validate", "keys/empty"], 1),
    ("check bad", ["check", BAD], 1),
    ("lint good", ["lint", "--strict", GOOD], 0),
    ("lint invalid manifests", ["lint", BAD], 1),
    ("lint unreadable schemas", ["lint", GOOD, "--upstream-schemas", "nope.json"], 1),
    ("lint unknown code to disable", ["lint", GOOD, "--disable", "L999"], 1),
    ("test good", ["test", "tests/contracts", "-m", GOOD], 0),
    ("test failing case", ["test", "failing.test.yaml", "-m", GOOD], 1),
    ("test invalid manifests", ["test", "tests/contracts", "-m", BAD], 1),
    ("test missing tests", ["test", "nowhere", "-m", GOOD], 1),
    ("publish good", ["manifests", "publish", GOOD, "--key", "keys/mf.key"], 0),
    ("publish bad", ["manifests", "publish", BAD, "--key", "keys/mf.key"], 1),
    ("approve good", ["manifests", "approve", "stripe.refund", "--by", "bob", "--key", "keys/mf.key"], 0),
    ("approve unknown", ["manifests", "approve", "stripe.refnd", "--key", "keys/mf.key"], 1),
    ("approve without key", ["manifests", "approve", "stripe.refund"], 1),
    ("deprecate no approved version", ["manifests", "deprecate", "stripe.refund", "--key",
                                       "keys/mf.key"], 1),
    ("rollback good", ["manifests", "rollback", "stripe.refund", "1", "--key", "keys/mf.key"], 0),
    ("rollback no such version", ["manifests", "rollback", "stripe.refund", "9", "--key",
                                  "keys/mf.key"], 1),
    ("sign-index good", ["manifests", "sign-index", "--key", "keys/mf.key"], 0),
    ("sign-index missing key", ["manifests", "sign-index", "--key", "nokey"], 1),
    ("history good", ["manifests", "history", "stripe.refund"], 0),
    ("history unknown", ["manifests", "history", "nope"], 1),
    ("diff same", ["manifests", "diff", "stripe.refund", "1", "1"], 0),
    ("diff no such version", ["manifests", "diff", "stripe.refund", "1", "7"], 2),
    ("list good", ["manifests", "list"], 0),
    ("list damaged index", ["manifests", "list", "--registry", "damaged"], 1),
    ("verify good", ["manifests", "verify", "--trust", "keys/mf.pub"], 0),
    ("verify missing registry", ["manifests", "verify", "--registry", "nowhere"], 1),
    ("manifests check good", ["manifests", "check", GOOD], 0),
    ("rename good", ["manifests", "rename", "stripe.refund", "stripe.refund_charge", GOOD,
                     "--dry-run"], 0),
    ("rename unknown tool", ["manifests", "rename", "nope", "other", GOOD], 1),
    ("rename missing path", ["manifests", "rename", "a", "b", "nowhere"], 1),
    ("remove refused", ["manifests", "remove", "stripe.refund", GOOD], 1),
    ("remove only paths", ["manifests", "remove", GOOD], 1),
    ("init good", ["init", "billing.create_invoice", "--effect", "compensable"], 0),
    ("init bad name", ["init", "bad name"], 1),
    ("usage error", ["validate"], 2),
    ("unknown option", ["lint", "--bogus", GOOD], 2),
    ("bad choice", ["lint", GOOD, "-o", "xml"], 2),
]


@pytest.mark.parametrize(("name", "argv", "code"), CASES, ids=[c[0] for c in CASES])
def test_stdout_is_one_json_document_for_every_command(repo: Path, unwind: Run, name: str,
                                                       argv: list[str], code: int) -> None:
    (repo / "keys" / "empty").mkdir()
    (repo / "damaged").mkdir()
    (repo / "damaged" / "index.json").write_text("{not json")
    got, out, err = unwind(*argv, "--json")
    assert got == code, err
    doc = json.loads(out)  # one document: a second one, or any text, would not parse
    if code != 0 and isinstance(doc, dict) and "ok" in doc:
        assert doc["ok"] is False
    if code != 0 and not (isinstance(doc, dict) and doc.get("ok") is False):
        assert isinstance(doc, dict) and doc.get("equal") is False, doc  # only diff says so otherwise
    if isinstance(doc, dict) and "error" in doc:
        assert set(doc["error"]) >= {"code", "message"} and doc["error"]["message"] in err


def test_a_command_that_fails_before_its_result_gives_the_error_document(repo: Path,
                                                                          unwind: Run) -> None:
    code, out, err = unwind("manifests", "history", "nope", "--json")
    assert code == 1
    assert json.loads(out) == {"ok": False, "error": {
        "code": "not_found", "message": err.removeprefix("error: ").rstrip("\n")}}


def test_yaml_output_is_one_yaml_document_too(repo: Path, unwind: Run) -> None:
    for argv in (["validate", GOOD], ["validate", BAD], ["manifests", "list"],
                 ["manifests", "history", "nope"], ["lint", GOOD]):
        _, out, _ = unwind(*argv, "-o", "yaml")
        assert isinstance(yaml.safe_load(out), dict | list), argv


def test_diff_json_carries_both_versions_and_whether_they_are_equal(repo: Path, unwind: Run) -> None:
    unwind("manifests", "approve", "stripe.refund", "--by", "bob", "--key", "keys/mf.key")
    code, out, _ = unwind("manifests", "diff", "stripe.refund", "v1", "v2", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["equal"] is False and doc["diff"].startswith("--- stripe.refund@v1")
    assert (doc["a"]["version"], doc["b"]["manifest"]["lifecycle"]) == (1, "approved")
