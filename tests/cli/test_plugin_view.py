"""The kubectl plugin's pure parts: what a user types, and what is shown from the objects
kubectl returns. The cluster test (tests/cluster/test_plugin.py) runs the commands."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unwind.bundle import BUNDLE_NAME, INDEX_KEY, BundleEntry, build_bundle
from unwind.cli import plugin_view as view
from unwind.cli.kubectl import error_from_stderr, hoist_kube_flags
from unwind.cli.main import PLUGIN_COMMANDS, main
from unwind.cli.plugin_cmds import COMMANDS
from unwind.cli.plugin_view import Target, UsageError
from unwind.registry.signing import Signature

DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
A, B, C = ("sha256:" + c * 64 for c in "abc")


# ---- what a user types ----------------------------------------------------------------

@pytest.mark.parametrize(("text", "kind"), [
    ("tm/read", "ToolManifest"), ("toolmanifest/read", "ToolManifest"),
    ("toolmanifests/read", "ToolManifest"), ("TM/read", "ToolManifest"),
    ("toolmanifests.unwind.dev/read", "ToolManifest"), ("ledger/run-42", "EffectLedger"),
    ("effectledger/run-42", "EffectLedger"), ("effectledgers/run-42", "EffectLedger"),
])
def test_every_spelling_of_a_target_names_its_kind(text: str, kind: str) -> None:
    target = view.parse_target(text)
    assert target.kind == kind and target.name == text.split("/")[1]


@pytest.mark.parametrize(("text", "says"), [
    ("read", "name the kind and the object, as tm/NAME or ledger/NAME"),
    ("pod/read", "'pod' is not a kind this command takes"),
    ("tm/Read_Me", "is not a Kubernetes object name"),
    ("tm/", "is not a Kubernetes object name"),
    ("tm/read\n", "is not a Kubernetes object name"),
    ("tm/" + "a" * 254, "at most 253"),
])
def test_a_target_that_cannot_be_used_is_refused_with_what_to_type(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=re.escape(says)):
        view.parse_target(text)


def test_commands_that_only_read_manifests_refuse_a_ledger_and_say_what_they_take() -> None:
    with pytest.raises(UsageError, match=r"use tm/NAME$"):
        view.parse_target("ledger/run-42", ("ToolManifest",))


@pytest.mark.parametrize(("text", "version"), [("2", 2), ("v2", 2), ("V10", 10)])
def test_a_version_is_a_number_with_or_without_a_v(text: str, version: int) -> None:
    assert view.parse_version(text) == version


@pytest.mark.parametrize("text", ["0", "v", "x2", "2.0", "-1", "", "v-3", "v²", "2\n"])
def test_anything_else_is_not_a_version(text: str) -> None:
    with pytest.raises(UsageError, match="give a number such as 2 or v2"):
        view.parse_version(text)


def test_an_approval_name_says_what_was_decided() -> None:
    assert view.approval_name("read", "approve", "v2", "1a2b3c4d") == "read-approve-v2-1a2b3c4d"
    assert view.approval_name("run-42", "deny", "E_0007/x", "00ff00ff") == "run-42-deny-e-0007-x-00ff00ff"


names = st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,252})\Z").filter(lambda n: view.is_object_name(n))


@given(names, st.sampled_from(["approve", "deny"]), st.text(max_size=300) | st.just("v12"))
def test_an_approval_name_is_always_a_valid_object_name(target: str, decision: str, detail: str) -> None:
    name = view.approval_name(target, decision, detail, "0123abcd")
    assert len(name) <= 253 and DNS.fullmatch(name), name
    assert f"-{decision}-" in name and name.endswith("-0123abcd")


def test_a_long_manifest_name_is_shortened_to_fit_without_ending_in_a_dot() -> None:
    suffix = "-approve-v3-0123abcd"
    for cut in ("-", ".", "-."):  # what would be left at the end of the shortened name
        target = "a" * (253 - len(suffix) - len(cut)) + cut + "b" * 40
        name = view.approval_name(target, "approve", "v3", "0123abcd")
        assert len(name) <= 253 and DNS.fullmatch(name), name
        assert name == "a" * (253 - len(suffix) - len(cut)) + suffix


def test_kubectl_flags_before_a_plugin_command_move_after_it() -> None:
    cmds = PLUGIN_COMMANDS
    assert hoist_kube_flags(["-n", "shop", "status"], cmds) == ["status", "-n", "shop"]
    assert hoist_kube_flags(["--kubeconfig=k", "--as", "bob", "--as-group", "g", "approve", "tm/a"], cmds) \
        == ["approve", "--kubeconfig=k", "--as", "bob", "--as-group", "g", "tm/a"]
    assert hoist_kube_flags(["-n", "shop", "validate", "x"], cmds) == ["-n", "shop", "validate", "x"]
    assert hoist_kube_flags(["status", "-n", "shop"], cmds) == ["status", "-n", "shop"]
    assert hoist_kube_flags(["-n"], cmds) == ["-n"]


def test_main_knows_every_plugin_command_without_importing_the_module() -> None:
    assert set(PLUGIN_COMMANDS) == set(COMMANDS)


# ---- kubectl's errors -----------------------------------------------------------------

def test_a_webhook_refusal_is_shown_as_the_webhooks_sentence_alone() -> None:
    err = error_from_stderr('Error from server: error when creating "STDIN": admission webhook '
                            '"approvals.stamp.unwind.dev" denied the request: four-eyes: you (alice) '
                            "last changed the spec of ToolManifest 'read'; someone else must approve it\n")
    assert str(err) == "four-eyes: you (alice) last changed the spec of ToolManifest 'read'; someone else must approve it"
    assert err.reason == ""


def test_an_api_error_keeps_its_reason_for_the_caller() -> None:
    err = error_from_stderr('Error from server (NotFound): toolmanifests.unwind.dev "nope" not found\n')
    assert (err.reason, str(err)) == ("NotFound", 'toolmanifests.unwind.dev "nope" not found')
    err = error_from_stderr('Error from server (AlreadyExists): error when creating "STDIN": '
                            'approvals.unwind.dev "a4" already exists')
    assert (err.reason, str(err)) == ("AlreadyExists", 'approvals.unwind.dev "a4" already exists')


def test_klog_noise_is_dropped_and_the_last_sentence_kept() -> None:
    stderr = ('E1130 08:12:52.840357    1897 memcache.go:265] "Unhandled Error" err="couldn\'t get"\n'
              "The connection to the server localhost:8080 was refused - did you specify the right host or port?\n")
    assert str(error_from_stderr(stderr)).startswith("The connection to the server localhost:8080 was refused")
    assert str(error_from_stderr("error: context \"x\" does not exist\n")) == 'context "x" does not exist'


def test_without_kubectl_on_path_every_command_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["status", "-n", "shop"]) == 1
    assert "error: kubectl is not on PATH" in capsys.readouterr().err
    assert main(["diff", "tm/read", "1", "2"]) == 2  # diff's errors are 2, its "differ" is 1
    assert main(["approve", "tm/read", "--entry", "e-1"]) == 1
    assert "--entry names a ledger entry" in capsys.readouterr().err


def test_several_targets_are_for_manifests_and_a_ledger_entry_is_decided_one_per_command(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # refused before any kubectl call
    assert main(["approve", "tm/read", "ledger/run-1", "--entry", "e-1"]) == 1
    assert "several targets are for ToolManifests (tm/A tm/B ...); decide on one ledger entry per " \
           "command: ledger/NAME --entry ID" in capsys.readouterr().err
    assert main(["deny", "tm/read", "tm/write", "--entry", "e-1"]) == 1
    assert "--entry names a ledger entry" in capsys.readouterr().err
    assert main(["approve", "tm/read", "tm/write", "--ledger", "run.json"]) == 1
    assert "drop tm/read tm/write" in capsys.readouterr().err
    assert main(["approve", "tm/read", "tm/write"]) == 1  # then kubectl is needed
    assert "error: kubectl is not on PATH" in capsys.readouterr().err


# ---- tables ---------------------------------------------------------------------------

def test_a_table_aligns_its_columns_under_upper_case_headers() -> None:
    text = view.table(("NAME", "VERSION", "STATE"), [("read", 1, "enforced"), ("create-order", None, "x")])
    lines = text.splitlines()
    assert lines[0] == "NAME           VERSION   STATE"
    assert lines[2] == "create-order   -         x"
    assert all(line == line.rstrip() for line in lines)
    assert {line.index(word) for line, word in zip(lines, ("STATE", "enforced", "x"), strict=True)} == {25}


# ---- objects kubectl returns ----------------------------------------------------------

def manifest(name: str = "read", *, gen: int = 1, observed: int | None = 1, conds: dict[str, tuple[str, str, str]]
             | None = None, author: str | None = "alice", **status: Any) -> dict[str, Any]:
    conditions = [{"type": t, "status": s, "reason": r, "message": m} for t, (s, r, m) in (conds or {}).items()]
    return {"metadata": {"name": name, "namespace": "shop", "uid": f"uid-{name}", "generation": gen,
                         "annotations": {"unwind.dev/applied-by": author} if author else {}},
            "spec": {"tool": "shop.get_order", "effect": "read_only", "permission": "shop:read"},
            "status": {**({"observedGeneration": observed} if observed is not None else {}),
                       "conditions": conditions, **status}}


def revision(owner: str, version: int, checksum: str, author: str = "alice") -> dict[str, Any]:
    return {"metadata": {"name": f"{owner}-{checksum[7:19]}", "creationTimestamp": f"2026-01-0{version}T00:00:00Z",
                         "annotations": {"unwind.dev/checksum": checksum, "unwind.dev/applied-by": author},
                         "ownerReferences": [{"kind": "ToolManifest", "name": owner, "uid": f"uid-{owner}"}]},
            "revision": version, "data": {"tool": "shop.get_order", "version": version}}


def approval(name: str, manifest: str, checksum: str, decision: str, who: str | None, created: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "annotations": {"unwind.dev/approver": who} if who else {}},
            "spec": {"target": {"toolManifest": manifest, "checksum": checksum}, "decision": decision}}


OK = {"Valid": ("True", "ValidationPassed", ""), "Approved": ("True", "Approved", "version 1 approved by bob"),
      "Ready": ("True", "Ready", "version 1 is enforced")}


def test_history_shows_each_versions_author_approvers_signer_and_the_enforced_one() -> None:
    obj = manifest(checksum=C, version=3, conds=OK)
    revisions = [revision("read", 2, B, "dave"), revision("read", 1, A), revision("read", 3, C),
                 revision("other", 1, A)]
    approvals = [approval("x1", "read", A, "approve", "bob", "1"), approval("x2", "read", A, "approve", "carol", "2"),
                 approval("x3", "read", B, "approve", "bob", "3"), approval("x4", "read", B, "deny", "carol", "4"),
                 approval("x5", "other", C, "approve", "bob"), approval("x6", "read", C, "approve", None)]
    rows = view.history(obj, revisions, approvals, view.Enforced(1, A, "k1"))
    assert [r.version for r in rows] == [1, 2, 3]
    assert [r.decided() for r in rows] == ["bob, carol", "denied by carol", "(unstamped)"]
    assert [r.author for r in rows] == ["alice", "dave", "alice"]
    assert [(r.enforced, r.signed_by) for r in rows] == [(True, "k1"), (False, None), (False, None)]
    assert [r.current for r in rows] == [False, False, True]
    assert rows[0].cells() == [1, "a" * 12, "alice", "bob, carol", "k1", "yes", "2026-01-01T00:00:00Z"]
    assert rows[1].to_json()["deniedBy"] == ["carol"]


def test_history_names_the_trusted_applier_of_the_enforced_version() -> None:
    obj = manifest(author="admin", checksum=A, version=1, conds=OK,
                   approvedBy={"user": "admin", "groups": [], "checksum": A})
    rows = view.history(obj, [revision("read", 1, A, "admin")], [], view.Enforced(1, A, "k1"))
    assert rows[0].decided() == "admin (trusted applier)"


def test_the_enforced_version_and_its_signer_are_read_from_the_bundle_index_by_source() -> None:
    entries = [BundleEntry("shop.get_order", 2, B, b"{}", "read"),
               BundleEntry("shop.list_orders", 1, A, b"{}", "list")]
    index = build_bundle("shop", entries, generation=1, high_water={},
                         signer=lambda m: Signature("k2", "sig"))[BUNDLE_NAME][INDEX_KEY]
    assert view.enforced_from_index(index, "read") == view.Enforced(2, B, "k2")
    assert view.enforced_from_index(index, "list") == view.Enforced(1, A, "k2")
    assert view.enforced_from_index(index, "nope") is None
    assert view.enforced_from_index("not json", "read") is None


def test_an_unknown_version_is_refused_naming_the_versions_that_exist() -> None:
    obj = manifest()
    revisions = [revision("read", 1, A), revision("read", 2, B)]
    assert view.revision_data(view.revision(obj, revisions, 2))["version"] == 2
    with pytest.raises(UsageError, match=r"tm/read has no version 5; its versions: 1, 2$"):
        view.revision(obj, revisions, 5)


def test_a_diff_shows_the_changed_line_and_nothing_when_equal() -> None:
    a = {"tool": "t", "effect": "read_only", "retry": {"attempts": 1}}
    b = {**a, "description": "Read one order."}
    text = view.diff_text("tm/read v1", a, "tm/read v2", b)
    assert text.startswith("--- tm/read v1\n+++ tm/read v2\n")
    assert "+description: Read one order.\n" in text.splitlines(keepends=True)
    assert view.diff_text("x", a, "y", dict(a)) == ""


@pytest.mark.parametrize(("obj", "state", "waiting"), [
    (manifest(observed=None), "not reconciled", "the operator to read the latest spec"),
    (manifest(gen=2, observed=1, conds=OK), "not reconciled", "the operator to read the latest spec"),
    (manifest(conds={"Valid": ("False", "ValidationFailed", "retry: remove retry"),
                     "Ready": ("False", "ValidationFailed", "")}), "invalid", "fix: retry: remove retry"),
    (manifest(conds={"Valid": ("True", "", ""), "Approved": ("False", "AwaitingApproval", ""),
                     "Ready": ("False", "AwaitingApproval", "")}), "waits for approval",
     "an approver other than alice"),
    (manifest(author=None, conds={"Valid": ("True", "", ""), "Approved": ("False", "AwaitingApproval", "")}),
     "waits for approval", "an approver"),
    (manifest(conds={"Valid": ("True", "", ""), "Approved": ("False", "Draft", ""),
                     "Ready": ("True", "DraftRecorded", "")}), "draft",
     "an approver other than alice, to promote it"),
    (manifest(checksum=B, conds={"Valid": ("True", "", ""), "Approved": ("False", "Denied", "")}),
     "denied", "a new spec: a deny is final (denied by carol)"),
    (manifest(conds=OK), "enforced", "-"),
    (manifest(conds={**OK, "Ready": ("False", "DeletionBlocked", "")},
              readers=[{"name": "create", "path": "compensation.tool"}]),
     "deletion blocked", "its readers to go: tm/create"),
    (manifest(conds={**OK, "Ready": ("False", "NotPublished", "")}), "approved", "the operator to publish it"),
])
def test_the_state_of_a_manifest_says_who_or_what_it_waits_for(obj: dict[str, Any], state: str,
                                                                 waiting: str) -> None:
    by = view.decisions([approval("d", "read", B, "deny", "carol")], "read")
    assert view.state(obj, by) == view.State(state, waiting)


def test_the_namespace_summary_is_sorted_by_name_and_shortens_long_reasons() -> None:
    long = "x" * 300
    rows = view.summaries([manifest("zeta", conds=OK, version=2, publishedVersion=1),
                           manifest("alpha", conds={"Valid": ("False", "ValidationFailed", long)})], [])
    assert [r.name for r in rows] == ["alpha", "zeta"]
    assert len(str(rows[0].cells()[5])) == 100 and rows[0].to_json()["waitingFor"] == f"fix: {long}"
    assert rows[1].cells() == ["zeta", "shop.get_order", 2, 1, "enforced", "-"]
    assert rows[1].to_json()["waitingFor"] is None


def test_the_detail_of_one_manifest_lists_every_condition_and_what_it_waits_for() -> None:
    obj = manifest(version=2, checksum=B, publishedVersion=1, publishedChecksum=A, keyId="k1",
                   approvedBy={"user": "bob", "approval": "read-approve-v1-00", "checksum": A}, lifecycle="draft",
                   conds={"Valid": ("True", "ValidationPassed", "ok"),
                          "Approved": ("False", "AwaitingApproval", "version 2 waits for approval")})
    text = view.Detail(obj).text()
    assert "Enforced:        version 1 (aaaaaaaaaaaa), signed by key k1" in text
    assert "Approved by:     bob (Approval read-approve-v1-00)" in text
    assert "Waiting for:     an approver other than alice" in text
    assert "  Approved   False    AwaitingApproval   version 2 waits for approval" in text
    as_json = view.Detail(obj).to_json()
    assert as_json["enforced"] == {"version": 1, "checksum": A, "keyId": "k1"}
    assert (as_json["state"], as_json["waitingFor"]) == ("waits for approval", "an approver other than alice")


def test_the_plugin_reads_the_labels_and_annotations_the_operator_writes() -> None:
    from unwind.operator import kube

    assert (view.OWNER_LABEL, view.CHECKSUM_ANNOTATION, view.AUTHOR_ANNOTATION) == \
        (kube.OWNER_LABEL, kube.CHECKSUM_ANNOTATION, kube.AUTHOR_ANNOTATION)
    assert str(Target("ToolManifest", "read")) == "tm/read"


def test_a_decision_waits_for_the_operator_to_have_seen_the_spec_and_needs_a_valid_one() -> None:
    from unwind.cli.plugin_cmds import Refusal, _current_version

    target = Target("ToolManifest", "read")
    with pytest.raises(Refusal, match=r"not reported on it yet \(is the Unwind operator running\?\)"):
        _current_version(target, {"metadata": {"generation": 1}}, "approve")
    with pytest.raises(Refusal, match=r"^tm/read: the operator has not seen the latest spec yet; try again$"):
        _current_version(target, manifest(gen=2, observed=1, conds=OK, checksum=A, version=1), "approve")
    broken = manifest(conds={"Valid": ("False", "SetValidationFailed", "compensation.tool: no such tool")})
    with pytest.raises(Refusal, match=r"^tm/read is invalid, so there is nothing to deny: compensation.tool: "
                                      r"no such tool; fix the spec first$"):
        _current_version(target, broken, "deny")
    assert _current_version(target, manifest(conds=OK, checksum=A, version=3), "approve") == (A, 3)


def test_wait_timeouts_need_a_unit_like_kubectls() -> None:
    from unwind.cli.plugin_cmds import _timeout

    assert _timeout("2m") == 120 and _timeout("500ms") == 0.5
    for bad in ("60", "soon"):
        with pytest.raises(UsageError, match="--timeout"):
            _timeout(bad)
