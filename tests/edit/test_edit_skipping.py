"""Run from a repository root, an edit reads manifests and contract tests and leaves the
rest alone, listed with why: Helm templates, other Kubernetes YAML, configuration.
Hidden and .gitignored folders are not even read."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from edit_helpers import FIXTURES

from unwind.edit import apply_to_paths, expand, remove, rename
from unwind.edit.select import select

BROKEN_MANIFEST = "- tool: stripe.refund\n  effect: [unclosed\n"
TEMPLATE = """\
{{- if .Values.rbac.create }}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ include "unwind.fullname" . }}
{{- end }}
"""
TOOL_MANIFEST_TEMPLATE = """\
{{- if .Values.examples }}
apiVersion: unwind.dev/v1alpha1
kind: ToolManifest
metadata: {name: refund}
spec: {tool: stripe.refund, effect: idempotent, permission: payments:write}
{{- end }}
"""
CRD = """\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: toolmanifests.unwind.dev}
spec:
  group: unwind.dev
  names: {kind: ToolManifest, plural: toolmanifests}
"""
CONTRACT_TESTS = """\
tests:
  - name: a refund
    tool: stripe.refund
    args: {charge_id: ch_1}
"""


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A repository: manifests, contract tests, a chart, CRDs, config, and places not to read."""
    root = tmp_path / "repo"
    shutil.copytree(FIXTURES / "remove_with_readers" / "before", root / "manifests")
    (root / "manifests" / "payments.test.yaml").rename(root / "payments.test.yaml")
    files = {
        "tests/contracts/refund.test.yaml": CONTRACT_TESTS,
        "charts/unwind/Chart.yaml": "apiVersion: v2\nname: unwind\nversion: 0.1.0\n",
        "charts/unwind/values.yaml": "rbac:\n  create: true\n",
        "charts/unwind/templates/clusterrole.yaml": TEMPLATE,
        "charts/unwind/templates/toolmanifest.yaml": TOOL_MANIFEST_TEMPLATE,
        "crds/toolmanifest.yaml": CRD,
        "manifests/00-namespaces.yaml": "apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n",
        "unwind.yaml": "manifests: registry\n",
        "registry/index.json": '{"tools": {"stripe.refund": [1]}}\n',
        "empty.yaml": "",
        ".gitignore": "/build/\n*.tmp.yaml\n",
        "build/payments.yaml": BROKEN_MANIFEST,  # ignored: would be a parse_error if read
        "manifests/scratch.tmp.yaml": BROKEN_MANIFEST,
        "charts/.gitignore": "!keep.tmp.yaml\n",
        "charts/keep.tmp.yaml": "note: kept by a negation\n",
        ".venv/lib/site.yaml": BROKEN_MANIFEST,  # hidden folders are never walked
        ".dev/cluster/kubeconfig.yaml": BROKEN_MANIFEST,
        ".github/workflows/ci.yaml": BROKEN_MANIFEST,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_folder_walk_skips_hidden_and_gitignored_paths(repo: Path) -> None:
    found = [Path(f).relative_to(repo).as_posix() for f in expand([repo])]
    assert found == [
        "charts/keep.tmp.yaml",
        "charts/unwind/Chart.yaml",
        "charts/unwind/templates/clusterrole.yaml",
        "charts/unwind/templates/toolmanifest.yaml",
        "charts/unwind/values.yaml",
        "crds/toolmanifest.yaml",
        "empty.yaml",
        "manifests/00-namespaces.yaml",
        "manifests/payments.yaml",
        "payments.test.yaml",
        "tests/contracts/refund.test.yaml",
        "unwind.yaml",
    ]


def test_a_rename_from_the_root_edits_manifests_and_tests_and_lists_the_rest_as_skipped(
        repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    before = snapshot(repo)
    result = apply_to_paths(["."], rename, "stripe.refund", "stripe.refunds.create")
    assert result.success, result.errors
    assert result.changes.files == [
        "manifests/payments.yaml", "payments.test.yaml", "tests/contracts/refund.test.yaml"]
    assert [(s.file, s.reason, s.mentions) for s in result.skipped] == [
        ("charts/keep.tmp.yaml", "holds no tool manifest and no contract test", ()),
        ("charts/unwind/Chart.yaml", "holds no tool manifest and no contract test", ()),
        ("charts/unwind/templates/clusterrole.yaml",
         "a Helm template ({{ ... }}): not plain YAML, not edited", ()),
        ("charts/unwind/templates/toolmanifest.yaml",
         "a Helm template ({{ ... }}): not plain YAML, not edited", ("stripe.refund",)),
        ("charts/unwind/values.yaml", "holds no tool manifest and no contract test", ()),
        ("crds/toolmanifest.yaml", "holds Kubernetes CustomResourceDefinition, no ToolManifest", ()),
        ("empty.yaml", "empty", ()),
        ("manifests/00-namespaces.yaml", "holds Kubernetes Namespace, no ToolManifest", ()),
        ("unwind.yaml", "holds no tool manifest and no contract test", ()),
    ]
    after = snapshot(repo)
    assert {f for f in after if after[f] != before[f]} == set(result.changes.files)
    assert "tool: stripe.refunds.create" in after["tests/contracts/refund.test.yaml"].decode()


def test_a_remove_from_the_root_skips_the_same_files(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo)
    result = apply_to_paths(["."], remove, ["stripe.list_charges"])
    assert result.success, result.errors
    assert result.changes.files == ["manifests/payments.yaml"]
    assert len(result.skipped) == 9


def test_a_yaml_error_in_a_file_that_looks_like_a_manifest_is_still_an_error(repo: Path) -> None:
    (repo / "manifests" / "broken.yaml").write_text(BROKEN_MANIFEST)
    before = snapshot(repo)
    result = apply_to_paths([repo], rename, "stripe.refund", "stripe.refunds.create")
    assert [e.code for e in result.errors] == ["parse_error"]
    assert result.errors[0].message.startswith(f"{repo}/manifests/broken.yaml: not valid YAML")
    assert "it mentions tool: or kind: ToolManifest, so it is not skipped" in result.errors[0].message
    assert snapshot(repo) == before


@pytest.mark.parametrize("text", [
    "apiVersion: unwind.dev/v1alpha1\nkind: ToolManifest\nspec: [unclosed\n",
    '- "tool": a\n  effect: [unclosed\n',
    # an idempotency key template is not a Helm template
    '- tool: a\n  idempotency: {key: "k-{{args.id}}"}\n  effect: [unclosed\n',
    'tests:\n  - name: x\n    tool: a\n    args: {a: [unclosed\n',
])
def test_a_named_file_that_looks_like_a_manifest_is_never_skipped_for_a_yaml_error(
        tmp_path: Path, text: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    result = apply_to_paths([path], rename, "a", "b")
    assert [e.code for e in result.errors] == ["parse_error"]
    assert result.skipped == []


def test_a_named_file_without_manifests_is_listed_as_skipped_not_dropped(repo: Path) -> None:
    template = repo / "charts" / "unwind" / "templates" / "clusterrole.yaml"
    result = apply_to_paths([repo / "manifests" / "payments.yaml", template],
                            rename, "stripe.refund", "stripe.refunds.create")
    assert result.success, result.errors
    assert [s.file for s in result.skipped] == [str(template)]


def test_a_named_hidden_or_ignored_folder_is_read(repo: Path) -> None:
    assert expand([repo / "build"]) == [str(repo / "build" / "payments.yaml")]
    assert expand([repo / ".dev"]) == [str(repo / ".dev" / "cluster" / "kubeconfig.yaml")]


def test_a_yaml_file_naming_a_tool_without_being_a_manifest_goes_to_the_validator() -> None:
    # no `effect`: not a unit, but the validator must see it and say what is missing
    files = {"a.yaml": "- tool: a\n  effect: read_only\n", "b.yaml": "- tool: b\n  permission: x\n"}
    selection = select(files)
    assert sorted(selection.files) == ["a.yaml", "b.yaml"]
    assert selection.skipped == []
    seen: list[str] = []
    result = rename(files, "a", "c", validator=lambda after, before: seen.extend(after) or [])
    assert result.success
    assert sorted(seen) == ["a.yaml", "b.yaml"]


def test_a_skipped_file_reports_only_whole_name_mentions() -> None:
    files = {"m.yaml": "- tool: a.b\n  effect: read_only\n",
             "t.yaml": "{{ .Values.x }}: [a.bc, xa.b, a.b/c, 'a.b']\n"}
    (skipped,) = rename(files, "a.b", "a.c").skipped
    assert skipped.mentions == ("a.b",)
    files["t.yaml"] = "{{ .Values.x }}: [a.bc, xa.b, a.b/c]\n"
    (skipped,) = rename(files, "a.b", "a.c").skipped
    assert skipped.mentions == ()


def test_a_template_that_parses_as_yaml_is_edited_like_any_file() -> None:
    text = ("apiVersion: unwind.dev/v1alpha1\nkind: ToolManifest\n"
            "metadata: {name: {{ .Values.name }}}\n"
            "spec: {tool: a, effect: read_only, permission: x}\n")
    result = rename({"t.yaml": text}, "a", "b")
    assert result.success, result.errors
    assert result.files == {"t.yaml": text.replace("tool: a,", "tool: b,")}


def test_the_command_lists_skipped_files_in_text_and_json_and_warns_of_mentions(
        repo: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from unwind.cli.main import main

    monkeypatch.chdir(repo)
    before = snapshot(repo)
    assert main(["manifests", "rename", "stripe.refund", "stripe.refunds.create", "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert "skipped 9 files holding no tool manifest and no contract test:\n" in out
    assert ("  charts/unwind/templates/clusterrole.yaml: a Helm template ({{ ... }}): "
            "not plain YAML, not edited\n") in out
    assert err == ('warning: charts/unwind/templates/toolmanifest.yaml was not edited but '
                   'mentions "stripe.refund": check it by hand\n')
    assert main(["manifests", "rename", "stripe.refund", "stripe.refunds.create", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["skipped"][3] == {"file": "charts/unwind/templates/toolmanifest.yaml",
                                    "reason": "a Helm template ({{ ... }}): not plain YAML, not edited",
                                    "mentions": ["stripe.refund"]}
    after = snapshot(repo)
    assert {f for f in after if after[f] != before[f]} == set(answer["changes"]["files"])
