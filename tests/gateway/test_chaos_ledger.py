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

from unwind.ledger.filestore import read_run

from .chaos import check_nothing_lost, comment_until_stopped
from .conftest import UpstreamProc, start_gateway

ROUNDS = 3


def test_a_gateway_killed_at_random_moments_loses_no_entry_and_calls_nothing_unwritten(
        upstream: UpstreamProc, manifests: Path, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger"
    upstream.admin("watch", {"ledger_dir": str(ledger)})
    rng = random.Random(20)  # seeded, so a failure can be replayed
    answered: dict[str, int] = {}
    for round_ in range(ROUNDS):
        gw = start_gateway(manifests, ledger, tmp_path)
        stop = threading.Event()
        clients = [threading.Thread(target=comment_until_stopped, args=(gw, f"r{round_}-c{c}", answered, stop))
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
    check_nothing_lost(entries, upstream.admin("requests")["requests"], answered)
