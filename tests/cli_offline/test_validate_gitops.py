"""`unwind validate` as a pre-merge check runs it: no silent greens, the namespace sets the
cluster would see, each file of a project checked as what it is, every error in one run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .conftest import REPO, Run

READ = """\
apiVersion: unwind.dev/v1alpha1
kind: ToolManifest
metadata: {{name: {name}, namespace: {ns}}}
spec: {{tool: {tool}, effect: read_only, permission: p:read{extra}}}
"""
CREATE = """\
apiVersion: unwind.dev/v1alpha1
kind: ToolManifest
metadata: {{name: create, namespace: {ns}}}
spec:
  tool: shop.create_order
  effect: compensable
  permission: p:write
  compensation: {{tool: shop.cancel_order, argument_map: {{id: $result.id}}}}
"""


def read(name: str, tool: str, ns: str, extra: str = "") -> str:
    return READ.format(name=name, tool=tool, ns=ns, extra=extra)


# ---- no silent greens ------------------------------------------------------------------------

def test_a_misspelled_kind_is_an_error_not_a_silent_pass(project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(read("a", "a", "shop").replace("kind: ToolManifest",
                                                                    "kind: ToolManifst"))
    code, out, err = unwind("validate", "m.yaml")
    assert code == 1 and out == ""
    assert "m.yaml:1: kind: 'ToolManifst' is not a kind Unwind has (did you mean ToolManifest?)" in err


def test_an_unknown_kind_in_the_unwind_group_is_an_error(project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(read("a", "a", "shop").replace("kind: ToolManifest",
                                                                    "kind: Tool"))
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1 and "'Tool' is not a kind Unwind has" in err


def test_an_empty_folder_is_exit_1_unless_allowed(project: Path, unwind: Run) -> None:
    (project / "empty").mkdir()
    code, _, err = unwind("validate", "empty")
    assert code == 1
    assert "error: no tool manifest found in empty (0 files read, 0 not manifests): nothing was " \
           "checked; pass --allow-empty if that is expected" in err
    code, out, _ = unwind("validate", "empty", "--allow-empty")
    assert code == 0 and out.startswith("ok: 0 tool manifests valid")


def test_a_symlink_loop_is_not_followed_and_is_listed(project: Path, unwind: Run) -> None:
    (project / "loop").mkdir()
    os.symlink("..", project / "loop" / "self")
    code, out, err = unwind("validate", "loop")
    assert code == 1 and "no tool manifest found" in err
    assert "loop/self: a symbolic link to a folder: not followed" in out


def test_documents_that_are_not_manifests_are_listed_with_why(project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(read("a", "a", "shop") + "---\napiVersion: v1\nkind: "
                                    "ConfigMap\nmetadata: {name: settings}\n---\nfoo: 1\nbar: 2\n")
    code, out, _ = unwind("validate", "m.yaml")
    assert code == 0
    assert out.splitlines() == [
        "ok: 1 tool manifest valid in namespace shop",
        "not checked (1 file holding no tool manifest):",
        "  m.yaml: Kubernetes ConfigMap 'settings': not a ToolManifest; a mapping with bar, foo: "
        "neither a tool manifest (tool, effect, permission...) nor a Kubernetes object"]
    code, out, _ = unwind("validate", "m.yaml", "--json")
    assert [(s["line"], s["kind"]) for s in json.loads(out)["skipped"]] == [(6, "kubernetes"), (10, "other")]


def test_a_mapping_with_misspelled_manifest_keys_is_judged_as_a_manifest(project: Path,
                                                                          unwind: Run) -> None:
    (project / "m.yaml").write_text("tol: a\nefect: read_only\npermision: p\n")
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1 and "unknown field 'efect' (did you mean 'effect'?)" in err


# ---- namespaces, as the cluster sees them -------------------------------------------------

def test_the_same_tool_in_two_namespaces_is_not_a_duplicate(project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(read("a", "shop.get_order", "one") + "---\n"
                                    + read("a", "shop.get_order", "two"))
    code, out, err = unwind("validate", "m.yaml")
    assert code == 0, err
    assert out.startswith("ok: 2 tool manifests valid (one: 1, two: 1)")


def test_a_compensation_tool_that_lives_in_another_namespace_is_missing(project: Path,
                                                                        unwind: Run) -> None:
    (project / "m.yaml").write_text(CREATE.format(ns="shop") + "---\n"
                                    + read("cancel", "shop.cancel_order", "other"))
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1
    assert ("m.yaml:8: shop.create_order: compensation.tool: names 'shop.cancel_order', which "
            "has no manifest: add one or fix the name") in err


def test_an_approved_tool_leaning_on_a_draft_is_refused_as_the_operator_refuses_it(
        project: Path, unwind: Run) -> None:
    cancel = read("cancel", "shop.cancel_order", "shop").replace("read_only", "idempotent")
    (project / "m.yaml").write_text(CREATE.format(ns="shop") + "---\n"
                                    + cancel.replace("p:read}", "p:write, lifecycle: draft}"))
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1
    assert ("shop.create_order: compensation.tool: names 'shop.cancel_order', which has no "
            "approved version: approve it first") in err


def test_a_resource_without_a_namespace_takes_the_one_given(project: Path, unwind: Run) -> None:
    (project / "create.yaml").write_text(CREATE.format(ns="shop"))
    cancel = read("cancel", "shop.cancel_order", "x").replace("read_only", "idempotent")
    (project / "cancel.yaml").write_text(cancel.replace(", namespace: x", ""))
    assert unwind("validate", ".")[0] == 1  # cancel is in "default"
    code, out, err = unwind("validate", ".", "--namespace", "shop")
    assert code == 0, err
    assert out.startswith("ok: 2 tool manifests valid in namespace shop")


def test_bare_manifests_are_one_set_of_their_own(project: Path, unwind: Run) -> None:
    (project / "bare.yaml").write_text("tool: a\neffect: read_only\npermission: p\n")
    (project / "res.yaml").write_text(read("a", "a", "default"))
    code, out, err = unwind("validate", ".")
    assert code == 0, err
    assert out.startswith("ok: 2 tool manifests valid (bare manifests: 1, default: 1)")


# ---- a project folder ------------------------------------------------------------------------

def make_project(root: Path) -> None:
    shutil.copytree(REPO / "manifests", root / "manifests")
    shutil.copytree(REPO / "tests" / "contracts", root / "tests" / "contracts")
    (root / "unwind.yaml").write_text("manifests: registry\n")
    chart = root / "charts" / "agent"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: agent\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("tool: not-a-manifest\n")
    (chart / "templates" / "deploy.yaml").write_text(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: {{ .Release.Name }}\n")
    (root / "package.json").write_text('{"name": "site", "version": "1.0.0"}\n')
    (root / ".venv" / "lib").mkdir(parents=True)
    (root / ".venv" / "lib" / "junk.yaml").write_text("tool: [broken\n")
    (root / "build").mkdir()
    (root / "build" / "out.yaml").write_text("tool: [broken\n")
    (root / ".gitignore").write_text("build/\n")


def test_validate_dot_checks_each_file_as_what_it_is(project: Path, unwind: Run) -> None:
    make_project(project)
    assert unwind("manifests", "publish", "manifests")[0] == 0  # a folder registry
    code, out, err = unwind("validate", ".")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == ("ok: 13 tool manifests valid (code-hosting: 10, payments: 3); "
                        "1 configuration file, 2 contract test files, 1 folder registry checked")
    listed = "\n".join(lines[1:])
    assert "charts/agent/Chart.yaml: the Helm chart" in listed
    assert "charts/agent/values.yaml: the Helm chart" in listed
    assert "charts/agent/templates/deploy.yaml: a template of the Helm chart" in listed
    assert "package.json: a mapping with name, version" in listed
    assert ".venv" not in listed and "build/" not in listed and "registry/" not in listed


def test_validate_dot_reports_a_broken_test_file_a_damaged_registry_and_a_config_typo(
        project: Path, unwind: Run) -> None:
    make_project(project)
    unwind("manifests", "publish", "manifests")
    (project / "tests" / "contracts" / "new.test.yaml").write_text(
        "tests:\n  - name: x\n    tool: stripe.refund\n    expect_plan: maybe\n")
    version = next((project / "registry" / "tools").glob("*/v1.json"))
    version.write_text(version.read_text().replace('"permission": "', '"permission": "x'))
    (project / "unwind.yaml").write_text("manifests: registry\nmanifest_public_kye: k.pub\n")
    code, _, err = unwind("validate", ".")
    assert code == 1
    assert "tests/contracts/new.test.yaml:4: expect_plan: case 'x': input should be" in err
    assert f"{version.relative_to(project)}: " in err and "folder registry, version 1:" in err
    assert ("unwind.yaml: manifest_public_kye: unknown key 'manifest_public_kye' (did you mean "
            "'manifest_public_key'?)") in err
    assert err.rstrip().splitlines()[-1].startswith("3 errors in 3 files")


# ---- every error in one run ------------------------------------------------------------------

def test_every_error_of_a_file_comes_in_one_run(project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(
        "tool: shop.create_order\n"           # 1
        "effect: compensable\n"               # 2
        "permission: shop write\n"            # 3: whitespace (a rule)
        "timeout_ms: 5x\n"                    # 4: not a duration (a field)
        "retry: {attempts: 3}\n"              # 5: retry on a compensable tool (a rule)
        "owner: 5\n"                          # 6: not a list (a field)
        "ownr: me\n"                          # 7: unknown (a field)
        "idempotency: {key: fixed}\n"         # 8: no {{args...}} (a rule)
        "approval: {quorum: 2}\n"             # 9: a quorum without roles (a rule)
        "---\n"                               # 10
        "tool: [broken\n"                     # 11: a syntax error (seen on line 12)
        "---\n"
        "tool: b\n"                           # 13
        "effect: read_only\n"
        "permission: p\n"
        "permission: q\n")                    # 16: a key given twice
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1
    lines = err.splitlines()
    assert [line.split(": ")[1] for line in lines[:-1]] == [
        f"m.yaml:{n}" for n in (1, 3, 4, 5, 6, 7, 8, 9, 12, 16)]
    assert "compensation: a compensable tool must declare how it is undone" in lines[0]
    assert "YAML syntax error" in lines[8] and "given twice (first on line 15)" in lines[9]
    assert lines[-1] == "10 errors in 1 file (2 tool manifests read from 1 file)"


def test_the_line_of_a_field_whose_value_is_a_block_is_the_line_of_its_key(project: Path,
                                                                           unwind: Run) -> None:
    (project / "m.yaml").write_text(
        "tool: a\neffect: idempotent\npermission: p\nretry:\n  attempts: 3\n  backoff: 2\n"
        "approval:\n  roles: [x]\n  quorum: 20\n")
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1
    assert "m.yaml:6: a: retry.backoff: unknown field 'backoff'" in err
    assert "m.yaml:9: a: approval.quorum: must be between 1 and 10 (got 20)" in err
    (project / "m.yaml").write_text("tool: a\neffect: read_only\npermission: p\ncompensation:\n"
                                    "  tool: a.undo\n  argument_map: {id: $result.id}\n")
    code, _, err = unwind("validate", "m.yaml")
    assert "m.yaml:4: a: compensation: a read_only tool has nothing to undo" in err


@pytest.mark.parametrize("word", ["$arg.id", "$results.id", "args.id"])
def test_a_misspelled_reference_root_gets_a_suggestion(project: Path, unwind: Run, word: str) -> None:
    (project / "m.yaml").write_text(
        "- {tool: a.undo, effect: idempotent, permission: p}\n"
        "- tool: a\n  effect: compensable\n  permission: p\n  compensation:\n"
        f"    tool: a.undo\n    argument_map: {{id: '{word}'}}\n")
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1 and "did you mean" in err


def test_a_misspelled_tool_name_gets_a_suggestion(project: Path, unwind: Run) -> None:
    (project / "m.yaml").write_text(
        "- {tool: shop.cancel_order, effect: idempotent, permission: p}\n"
        "- tool: a\n  effect: compensable\n  permission: p\n  compensation:\n"
        "    tool: shop.cancel_ordr\n    argument_map: {id: $result.id}\n")
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1 and "names 'shop.cancel_ordr', which has no manifest (did you mean " \
        "'shop.cancel_order'?)" in err


@pytest.mark.parametrize(("field", "value"), [("timeout_ms", "400d"), ("timeout_ms", 10 ** 15),
                                              ("approval", "{timeout: 9999h}")])
def test_an_absurd_duration_is_refused(project: Path, unwind: Run, field: str, value: object) -> None:
    (project / "m.yaml").write_text(f"tool: a\neffect: idempotent\npermission: p\n{field}: {value}\n")
    code, _, err = unwind("validate", "m.yaml")
    assert code == 1 and "longer than" in err
