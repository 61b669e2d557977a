"""`unwind ledger list|show` (issue 30 #7): a laptop user reads a run with a command, not by
opening JSON files. The gateway of conftest.py writes the runs; the commands run as a user
runs them (processes) and read the folder while the gateway is still writing it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from unwind.cli.ledger_view import age, ledger_headers, printer_value, with_live

from .conftest import ROOT, GatewayProc, env

COMMENT = {"repo": "octo/hello", "issue": 7, "body": "hi"}


def unwind(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "unwind.cli.main", *args], cwd=ROOT, env=env(),
                          capture_output=True, text=True, timeout=60)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def test_ledger_show_prints_the_runs_page_as_kubectl_lists_it_and_each_entry(
        gateway: GatewayProc, run_name: str) -> None:
    assert gateway.call("github.create_comment", {**COMMENT, "client_id": "a"}, run=run_name,
                        key="a").status_code == 200
    assert gateway.call("github.create_comment", {**COMMENT, "client_id": "a"}, run=run_name,
                        key="b").status_code == 409
    out = unwind("ledger", "show", run_name, "--ledger-dir", str(gateway.ledger)).stdout
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "RUN", "ENTRIES", "LAST", "STATE", "LIVE", "AGE"]
    # LIVE: the comment stands, the refused call never ran (counted as the operator counts it)
    assert lines[1].split()[:5] == [run_name, run_name, "2", "refused", "1"]
    entries = [line.split() for line in lines[lines.index("") + 2:]]
    assert [e[:5] for e in entries] == [["1", "a", "github.create_comment", "reversible",
                                         "succeeded"],
                                        ["2", "b", "github.create_comment", "reversible",
                                         "refused"]]
    assert entries[1][5] == "duplicate" and entries[0][5] == "-"


def test_ledger_show_as_json_is_the_pages_list_unwind_plan_reads(
        gateway: GatewayProc, manifests: Path, run_name: str, tmp_path: Path) -> None:
    gateway.call("github.create_comment", {**COMMENT, "client_id": "j"}, run=run_name, key="j")
    document = json.loads(unwind("ledger", "show", run_name, "--ledger-dir",
                                 str(gateway.ledger), "-o", "json").stdout)
    assert document["kind"] == "List"
    [page] = document["items"]
    assert page["kind"] == "EffectLedger" and page["spec"]["run"] == run_name
    assert [e["id"] for e in page["status"]["entries"]] == ["j"]
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(document))
    plan = unwind("plan", "--ledger", str(saved), "-m", str(manifests)).stdout
    assert "github.delete_comment" in plan and "inverse" in plan


def test_ledger_list_has_a_row_for_each_run_and_says_which_runs_there_are_when_one_is_unknown(
        gateway: GatewayProc, run_name: str) -> None:
    gateway.call("github.create_comment", {**COMMENT, "client_id": "l"}, run=run_name, key="l")
    out = unwind("ledger", "list", "--ledger-dir", str(gateway.ledger)).stdout
    assert out.splitlines()[0].split()[:3] == ["NAME", "RUN", "ENTRIES"]
    assert any(line.split()[:3] == [run_name, run_name, "1"] for line in out.splitlines())
    wide = unwind("ledger", "list", "--wide", "--ledger-dir", str(gateway.ledger)).stdout
    assert "ROLLED BACK" in wide.splitlines()[0] and "PAGE" in wide.splitlines()[0]
    missing = unwind("ledger", "show", "no-such-run", "--ledger-dir", str(gateway.ledger),
                     check=False)
    assert missing.returncode == 1 and "no run no-such-run in" in missing.stderr
    assert run_name in missing.stderr  # its runs are named
    nowhere = unwind("ledger", "list", "--ledger-dir", str(gateway.ledger / "nope"), check=False)
    assert nowhere.returncode == 1 and "no ledger folder" in nowhere.stderr


def test_ledger_show_follow_prints_each_new_entry_as_the_gateway_writes_it(
        gateway: GatewayProc, run_name: str) -> None:
    gateway.call("github.create_comment", {**COMMENT, "client_id": "f1"}, run=run_name, key="f1")
    proc = subprocess.Popen([sys.executable, "-m", "unwind.cli.main", "ledger", "show", run_name,
                             "--ledger-dir", str(gateway.ledger), "--follow"], cwd=ROOT,
                            env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        seen: list[str] = []
        while not any(line.startswith("1 ") for line in seen):  # the table, first
            seen.append(proc.stdout.readline())
        gateway.call("github.create_comment", {**COMMENT, "client_id": "f2"}, run=run_name,
                     key="f2")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if line.split()[:2] == ["2", "f2"]:
                assert "succeeded" in line.split()
                break
        else:
            raise AssertionError(f"no row for f2: {seen}")
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(10) == 0, proc.stderr.read() if proc.stderr else ""


def test_printer_columns_are_read_as_kubectl_reads_them() -> None:
    page: dict[str, Any] = {"metadata": {"name": "r", "annotations": {"unwind.dev/x": "y"}},
                            "status": {"conditions": [{"type": "Ready", "reason": "A"},
                                                      {"type": "RolledBack", "reason": "Done"}]}}
    assert printer_value(page, '.status.conditions[?(@.type=="RolledBack")].reason') == "Done"
    assert printer_value(page, r".metadata.annotations.unwind\.dev/x") == "y"
    assert printer_value(page, ".status.live") is None
    assert ledger_headers() == ("NAME", "RUN", "ENTRIES", "LAST STATE", "LIVE", "AGE")


def test_a_local_runs_live_is_counted_from_all_its_pages_entries_as_the_operator_counts_it() -> None:
    def page(*entries: tuple[str, str]) -> dict[str, Any]:
        return {"status": {"entries": [{"state": s, "effect": e} for s, e in entries]}}
    pages = [page(("succeeded", "reversible"), ("succeeded", "read_only"), ("undone", "reversible")),
             page(("uncertain", "compensable"), ("refused", "irreversible"), ("pending", "idempotent"))]
    assert [p["status"].get("live") for p in with_live(pages)] == [2, None]
    kept = [{"status": {"live": 7, "entries": []}}]  # written by an operator: left as it is
    assert with_live(kept)[0]["status"]["live"] == 7
    assert with_live([]) == []


def test_ages_are_kubectls() -> None:
    now = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)

    def ago(**kw: float) -> str | None:
        return age((now - timedelta(**kw)).strftime("%Y-%m-%dT%H:%M:%SZ"), now)
    assert [ago(seconds=45), ago(seconds=312), ago(minutes=42), ago(hours=3, minutes=5),
            ago(hours=20), ago(days=3, hours=4), ago(days=9)] == [
        "45s", "5m12s", "42m", "3h5m", "20h", "3d4h", "9d"]


