"""What a gateway killed at random moments must leave, whichever ledger it writes: shared by
the file ledger's chaos test and the cluster's (tests/cluster/test_gateway_chaos.py)."""

from __future__ import annotations

import threading
from typing import Any, Protocol

import httpx2


class Calls(Protocol):
    def call(self, tool: str, arguments: dict[str, Any] | None = None, *, run: str | None = ...,
             key: str | None = ...) -> httpx2.Response: ...


def comment_until_stopped(gw: Calls, name: str, answered: dict[str, int],
                          stop: threading.Event) -> None:
    """One client: keyed comments, each body its entry id, until ``stop`` or the gateway is
    gone; each answer's status in ``answered``."""
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


def check_nothing_lost(entries: list[dict[str, Any]], requests: list[dict[str, Any]],
                       answered: dict[str, int]) -> None:
    """The run ``chaos`` after the kills: every call the upstream saw was already ``pending``
    in the ledger when it arrived (``requests``: the upstream's log, each with the ledger it
    read) and is still there; every 200 is ``succeeded``; each id once, ``seq`` unbroken;
    nothing ran twice; an entry no upstream call matches never succeeded."""
    by_id = {e["id"]: e for e in entries}
    assert len(by_id) == len(entries), "an id stored twice"
    assert sorted(e["seq"] for e in entries) == list(range(1, len(entries) + 1))
    seen = [r for r in requests if r["route"] == "comments.create"]
    assert len(seen) > 20, f"too few calls reached the upstream to prove anything ({len(seen)})"
    for request in seen:
        eid = request["arguments"]["body"]
        written = {e["id"]: e["state"] for e in request["ledger"] if e["ledger"].startswith("chaos")}
        assert written.get(eid) == "pending", f"{eid} reached the upstream unwritten"
        assert eid in by_id, f"{eid} reached the upstream and its entry was lost"
        assert by_id[eid]["state"] in ("pending", "succeeded"), by_id[eid]
    ok = [eid for eid, status in answered.items() if status == 200]
    assert ok, "no call was answered 200"
    assert all(by_id[eid]["state"] == "succeeded" for eid in ok)
    ran = {r["arguments"]["body"] for r in seen}
    assert len(seen) == len(ran), "a call ran twice"
    assert all(e["state"] in ("pending", "refused", "failed") for e in entries if e["id"] not in ran)
