"""The CLI says what it does and does it one way (issue 18, #5 and #6): a repeated
decision says "already decided", one output flag (`-o json|yaml`, `--json` a hidden
alias), `ledger export --file`, the plugin's help without internal commands, `unwind init`
for every effect, and counts in the right number."""

from __future__ import annotations

from typing import Any

from unwind.cli import plugin_view as view

APPROVER = "unwind.dev/approver"


def approval(name: str, who: str, target: dict[str, Any], decision: str = "approve",
             created: str = "2026-12-02T10:00:00Z") -> dict[str, Any]:
    return {"metadata": {"name": name, "creationTimestamp": created, "annotations": {APPROVER: who}},
            "spec": {"target": target, "decision": decision}}


ENTRY = {"effectLedger": "checkout-8", "entry": "pay-1"}


def test_a_second_identical_decision_by_the_same_person_is_found_as_already_decided() -> None:
    first = approval("a-1", "bob", ENTRY, created="2026-12-02T10:00:00Z")
    later = approval("a-0", "bob", ENTRY, created="2026-12-02T10:00:05Z")
    new = approval("a-2", "bob", ENTRY, created="2026-12-02T10:01:00Z")
    found = view.already_decided(new, [later, new, first], APPROVER)
    assert found is not None and found["metadata"]["name"] == "a-1"  # the earliest


def test_another_person_another_entry_or_another_decision_is_not_already_decided() -> None:
    new = approval("a-2", "bob", ENTRY)
    others = [approval("x-1", "carol", ENTRY), approval("x-2", "bob", {**ENTRY, "entry": "pay-2"}),
              approval("x-3", "bob", ENTRY, decision="deny"),
              approval("x-4", "bob", {"toolManifest": "checkout-8", "checksum": "sha256:" + "a" * 64})]
    assert view.already_decided(new, [*others, new], APPROVER) is None
    unstamped = {"metadata": {"name": "u"}, "spec": new["spec"]}
    assert view.already_decided(unstamped, [new], APPROVER) is None


def test_counts_of_one_are_singular_in_the_watch_and_the_plan() -> None:
    line = view.planned_line({"planned": "2026-12-02T10:00:00Z", "steps": [{"entry": "c1"}], "skipped": 0})
    assert line.startswith("planned at 2026-12-02T10:00:00Z: 1 step, 0 with nothing to undo"), line
    # the plan's "1 of 1 step run": tests/rollback/test_local_rollback.py


def test_the_operators_rollback_counts_are_singular_for_one() -> None:
    from unwind.operator.rollback import _n

    assert (_n(1, "step"), _n(2, "step"), _n(0, "lookup")) == ("1 step", "2 steps", "0 lookups")


# ---- one output flag ----------------------------------------------------------------------

def run(capsys: Any, *argv: str) -> tuple[int, str, str]:
    from unwind.cli.main import main

    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_is_a_hidden_alias_of_o_json_that_existing_scripts_still_use(capsys: Any) -> None:
    import json
    from pathlib import Path

    MANIFESTS = Path(__file__).resolve().parents[2] / "manifests"
    code, out, _ = run(capsys, "validate", "--help")
    assert code == 0 and "-o FORMAT" in out and "--json" not in out
    old = run(capsys, "validate", "--json", str(MANIFESTS))
    new = run(capsys, "validate", "-o", "json", str(MANIFESTS))
    assert old[0] == new[0] == 0 and json.loads(old[1]) == json.loads(new[1])


def test_plan_and_the_editor_take_o_json_like_every_other_command(capsys: Any, tmp_path: Any) -> None:
    for argv in (("plan", "--help"), ("manifests", "rename", "--help")):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and "-o FORMAT, --output FORMAT" in out and "--json" not in out, argv
    code, out, _ = run(capsys, "plan", "-o", "json", "--ledger", str(tmp_path / "none.json"), "-m", "x")
    assert code == 1 and '"ok": false' in out  # the one document, even on an error


def test_ledger_export_writes_to_file_and_o_is_a_deprecated_spelling(capsys: Any, tmp_path: Any) -> None:
    code, out, _ = run(capsys, "ledger", "export", "--help")
    assert code == 0 and "-f FILE, --file FILE" in out and "--out" not in out
    code, _, err = run(capsys, "ledger", "export", "x", "--key", "k", "-o", "json")
    assert code == 2 and "ledger export always writes signed JSON; name the file with --file" in err
    code, _, err = run(capsys, "ledger", "export", "x", "--key", "k")
    assert code == 2 and "--file FILE" in err
    code, _, err = run(capsys, "ledger", "export", "x", "--key", str(tmp_path / "no.key"), "-o",
                       str(tmp_path / "ev.json"))
    assert "note: -o/--out FILE is deprecated for ledger export: use --file FILE" in err
    assert code == 1  # and then the key is missing: it went on as before


# ---- the plugin's help, dev restart-operator ------------------------------------------------

def test_kubectl_unwind_help_lists_only_the_plugins_commands() -> None:
    from unwind.cli.main import PLUGIN_LISTED, build_parser, plugin_mode

    assert plugin_mode("/venv/bin/kubectl-unwind") and not plugin_mode("/venv/bin/unwind")
    text = build_parser(plugin=True).format_help()
    assert text.startswith("usage: kubectl unwind")
    listed = {line.split()[0] for line in text.split("COMMAND\n", 2)[-1].splitlines()
              if line.startswith("    ") and not line.startswith("     ")}
    assert listed == set(PLUGIN_LISTED)
    for internal in ("operator", "undo-step", "probe", "gateway-quit", "crds", "rotate-signing-key", "dev"):
        assert f"    {internal} " not in text
    full = build_parser().format_help()
    assert "    undo-step " in full and "    approve " in full


def test_a_hidden_command_still_runs_under_kubectl_unwind(capsys: Any) -> None:
    import sys

    argv0 = sys.argv[0]
    sys.argv[0] = "/venv/bin/kubectl-unwind"
    try:
        code, out, _ = run(capsys, "undo-step", "--help")
    finally:
        sys.argv[0] = argv0
    assert code == 0 and out.startswith("usage: kubectl unwind undo-step")


def test_dev_restart_operator_needs_a_running_dev_cluster(capsys: Any, tmp_path: Any) -> None:
    code, _, err = run(capsys, "dev", "restart-operator", "--dir", str(tmp_path))
    assert code == 1
    assert err.strip() == f"error: no dev cluster runs from {tmp_path}: start one with `unwind dev up`"
    code, out, _ = run(capsys, "dev", "--help")
    assert "restart-operator" in out
