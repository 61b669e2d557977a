"""Chaos: the local gateway killed (SIGKILL) at random moments while ten clients call it.

What must hold whatever the moment: the upstream never sees a call whose ``pending``
entry a reader of the ledger folder could not already find (written ahead), and no entry
is lost: every call the upstream saw, and every call answered 200, is in the ledger after
the kills (answered 200: ``succeeded``), each id once, in one unbroken ``seq``.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path

import httpx2

from unwind.ledger.filestore import read_run

from .conftest import GatewayProc, UpstreamProc, start_gateway

ROUNDS = 3


def _client(gw: GatewayProc, name: str, answered: dict[str, int], stop: threading.Event) -> None:
    n = 0
    while not stop.is_set():
        eid = f"{name}-{n}"
        n += 1
        try:
            r = gw.call("github.create_comment", {"repo": "octo/hello", "issue": 1, "body": eid,
                                                  "client_id": eid}, run="chaos", key=eid)
        except httpx2.HTTPError:
            return  # the gateway is gone
        answered[eid] = r.status_code


def test_a_gateway_killed_at_random_moments_loses_no_entry_and_calls_nothing_unwritten(
        upstream: UpstreamProc, manifests: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    upstream.admin("watch", {"ledger_dir": str(ledger)})
    rng = random.Random(20)  # seeded, so a failure can be replayed
    answered: dict[str, int] = {}
    for round_ in range(ROUNDS):
        gw = start_gateway(manifests, ledger, tmp_path)
        stop = threading.Event()
        clients = [threading.Thread(target=_client, args=(gw, f"r{round_}-c{c}", answered, stop))
                   for c in range(10)]
        for t in clients:
            t.start()
        time.sleep(rng.uniform(0.3, 1.2))
        gw.proc.kill()  # SIGKILL: no cleanup of any kind
        gw.proc.wait(10)
        stop.set()
        for t in clients:
            t.join(30)

    entries = [e for page in read_run(ledger, "chaos") for e in page["status"]["entries"]]
    by_id = {e["id"]: e for e in entries}
    assert len(by_id) == len(entries), "an id stored twice"
    assert sorted(e["seq"] for e in entries) == list(range(1, len(entries) + 1))
    seen = [r for r in upstream.admin("requests")["requests"] if r["route"] == "comments.create"]
    assert len(seen) > 20, "too few calls reached the upstream to prove anything"
    for request in seen:
        eid = request["arguments"]["body"]
        written = {e["id"]: e["state"] for e in request["ledger"]}
        assert written.get(eid) == "pending", f"{eid} reached the upstream unwritten"
        assert eid in by_id, f"{eid} reached the upstream and its entry was lost"
    ok = [eid for eid, status in answered.items() if status == 200]
    assert ok, "no call was answered 200"
    assert all(by_id[eid]["state"] == "succeeded" for eid in ok)
    assert len(seen) == len({r["arguments"]["body"] for r in seen}), "a call ran twice"
