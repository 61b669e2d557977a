"""Chaos: the local rollback killed (SIGKILL) at random moments and run again until done."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from gateway.conftest import ROOT, env

from .conftest import GatewayProc, UpstreamProc

UNDO_ROUTES = ("comments.delete", "issues.close")


def states_of(gateway: GatewayProc, run: str) -> Counter[str]:
    return Counter(e["state"] for e in gateway.entries(run))


def kill_during_work(proc: subprocess.Popen[bytes], gateway: GatewayProc, run: str,
                     rng: random.Random) -> bool:
    """SIGKILL the rollback a random moment (0-300 ms) after it next changed the ledger; False
    when it ended first."""
    before = gateway.entries(run)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        if gateway.entries(run) != before:
            time.sleep(rng.uniform(0, 0.3))
            break
        time.sleep(0.01)
    if proc.poll() is not None:
        return False
    proc.kill()  # SIGKILL: no cleanup of any kind
    return True


def test_a_rollback_killed_at_random_moments_undoes_every_entry_exactly_once(
        gateway: GatewayProc, upstream: UpstreamProc, manifests: Path, run_name: str,
        tmp_path: Path) -> None:
    for i in range(10):
        comment = {"repo": "octo/hello", "issue": 7, "client_id": f"c{i}", "body": "hi"}
        assert gateway.call("github.create_comment", comment, run=run_name,
                            key=f"c-{i}").status_code == 200
        assert gateway.call("github.create_issue", {"repo": "octo/hello", "title": f"t{i}"},
                            run=run_name, key=f"i-{i}").status_code == 200
    for route in (*UNDO_ROUTES, "comments.get", "issues.get"):  # steps long enough to land in
        upstream.behave(route, "slow", delay=0.04)
    seed = int(os.environ.get("UNWIND_CHAOS_SEED", time.time()))
    rng = random.Random(seed)
    command = [sys.executable, "-m", "unwind.cli.main", "rollback", "--ledger",
               str(gateway.ledger / f"{run_name}.json"), "-m", str(manifests), "--yes"]
    kills, progress = 0, [dict(states_of(gateway, run_name))]
    for attempt in range(40):
        log = (tmp_path / f"run-{attempt}.log").open("wb")
        proc = subprocess.Popen(command, cwd=ROOT, env=env(), stdout=log, stderr=subprocess.STDOUT)
        killed = False
        if attempt < 10:  # ten kills at random moments of the rollback's work, then let it end
            killed = kill_during_work(proc, gateway, run_name, rng)
            kills += killed
        code = proc.wait(60)
        log.close()
        states = states_of(gateway, run_name)
        progress.append(dict(states))
        if not killed and code == 0 and states == {"undone": 20}:
            break
        assert killed or code == 0, (f"seed {seed}: run {attempt} failed: "
                                     f"{(tmp_path / f'run-{attempt}.log').read_text()[-2000:]}")
    else:
        raise AssertionError(f"seed {seed}: not done after 40 runs: {progress}")
    assert kills >= 5, f"seed {seed}: only {kills} kills landed while the rollback worked"

    listing = upstream.admin("requests")
    undo_requests = [r for r in listing["requests"] if r["route"] in UNDO_ROUTES]
    keys_per_route = {route: {r["idempotency_key"] for r in undo_requests if r["route"] == route}
                      for route in UNDO_ROUTES}
    context = (f"seed {seed}, {kills} kills, {len(undo_requests) - 20} undo requests repeated, "
               f"progress {progress}")
    # Every undo took effect exactly once (repeats carried the same key and were replayed) ...
    assert listing["effects_by_route"].get("comments.delete") == 10, context
    assert listing["effects_by_route"].get("issues.close") == 10, context
    assert {route: len(keys) for route, keys in keys_per_route.items()} == {
        "comments.delete": 10, "issues.close": 10}, context
    # ... and none was lost: every entry is undone, and its undo names the key that went up.
    entries = gateway.entries(run_name)
    assert {e["undo"]["idempotency_key"] for e in entries} == keys_per_route["comments.delete"] | \
        keys_per_route["issues.close"], context
    assert all(e["undo"]["outcome"] == "undone" for e in entries), context
    print(f"chaos: {context}")  # shown with -s; the seed reproduces a failure
    assert json.loads((gateway.ledger / f"{run_name}.rollback.json").read_text())["rollbacks"]
