"""A real document store with revisions for the rollback tests: pouchdb-server (npm), the
CouchDB HTTP API on PouchDB, kept in memory.

Every write gives a document a new ``_rev``; an update or a delete naming a stale one is
refused with 409 ``conflict``, as CouchDB (and every API with ETags) refuses it; a delete
takes the revision as ``If-Match``. The manifests below undo a create by deleting the
document at the revision read right before the undo (``compensation.current``, sent as
``If-Match``), and an update by writing the captured title back at the current revision;
the update's divergence check compares the state before the undo with a read made right
after the call (``verification.after_call``: an update's answer, ``{ok, id, rev}``, holds
no field to compare). Used by tests/rollback/test_pouchdb.py (the local gateway and
``unwind rollback``) and by the real-node test (the gateway sidecar and the operator's
undo Jobs), which reads the store itself, never through Unwind. The manifests are the
ones docs/manifests.md shows, read from the page.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.doc_sections import blocks, section
from tests.gateway.installs import POUCHDB_SERVER, npm_tool

BASE = "http://127.0.0.1:5984"  # replaced by the test's own server
DB = "docs"

# The five manifests of docs/manifests.md, read from the page: what a reader copies is
# what runs, here and on the real node.
SECTION = "### Undo against the current state ($current)"
(MANIFESTS,) = blocks(section("manifests.md", SECTION), "yaml")


def manifests_for(url: str) -> str:
    return MANIFESTS.replace(BASE, url)


class PouchDB:
    """``pouchdb-server --in-memory`` on ``host:port``, with the database ``docs``."""

    def __init__(self, host: str, port: int, work: Path) -> None:
        binary = npm_tool(*POUCHDB_SERVER)
        self.url = f"http://{host}:{port}"
        self.log = work / "pouchdb-server.log"
        with self.log.open("wb") as out:  # its config and log files go to work/, not the clone
            self.proc = subprocess.Popen([str(binary), "--in-memory", "--host", host, "--port", str(port),
                                          "--no-stdout-logs", "--config", str(work / "config.json")],
                                         cwd=work, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.request("PUT", f"/{DB}")
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"pouchdb-server did not start: {self.log.read_text()[-2000:]}") from None
                time.sleep(0.3)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def put(self, doc_id: str, title: str) -> str:
        """Write a document straight to the store (not through Unwind); its new revision."""
        status, now = self.request("GET", f"/{DB}/{doc_id}")
        body = {"title": title, **({"_rev": now["_rev"]} if status == 200 else {})}
        status, answer = self.request("PUT", f"/{DB}/{doc_id}", body)
        assert status == 201, answer
        return str(answer["rev"])

    def reset(self, titles: dict[str, str]) -> None:
        """The store holding exactly ``titles`` (by id), as before a run."""
        for doc_id in set(self.titles()) - set(titles):
            status, now = self.request("GET", f"/{DB}/{doc_id}")
            status, answer = self.request("DELETE", f"/{DB}/{doc_id}?rev={now['_rev']}")
            assert status == 200, answer
        for doc_id, title in titles.items():
            self.put(doc_id, title)

    def titles(self) -> dict[str, str]:
        """Every live document's title, read from the store itself."""
        status, answer = self.request("GET", f"/{DB}/_all_docs?include_docs=true")
        assert status == 200, answer
        return {row["id"]: row["doc"].get("title") for row in answer["rows"]}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


# The agent's run, as a program any agent could be: through the gateway's REST interface
# ($UNWIND_GATEWAY, default where the injection puts the sidecar), each call with its own
# Idempotency-Key. Three documents created and then edited (a twice), and a document that
# existed before the run edited twice: the undos of each document must run newest first,
# each at the revision the one before it left. Run as `python -c AGENT` (the pod's image
# has no tests/).
AGENT = """
import json, os, time, urllib.request
GW = os.environ.get("UNWIND_GATEWAY", "http://127.0.0.1:8787")
for _ in range(200):
    try:
        urllib.request.urlopen(GW + "/readyz", timeout=2)
        break
    except OSError:
        time.sleep(0.3)
def call(tool, key, **arguments):
    req = urllib.request.Request(GW + "/call/" + tool, data=json.dumps({"arguments": arguments}).encode(),
                                 method="POST", headers={"Content-Type": "application/json", "Idempotency-Key": key})
    with urllib.request.urlopen(req, timeout=60) as answer:
        body = json.loads(answer.read())
    print(tool, key, json.dumps(body), flush=True)
    return body
rev = {d: call("docs.create", "create-" + d, id=d, title="draft " + d)["rev"] for d in ("a", "b", "c")}
rev["kept"] = call("docs.get", "read-kept", id="kept")["_rev"]
rev["kept"] = call("docs.update", "update-kept-1", id="kept", title="changed", _rev=rev["kept"])["rev"]
rev["a"] = call("docs.update", "update-a-1", id="a", title="final a", _rev=rev["a"])["rev"]
rev["kept"] = call("docs.update", "update-kept-2", id="kept", title="changed twice", _rev=rev["kept"])["rev"]
rev["b"] = call("docs.update", "update-b-1", id="b", title="final b", _rev=rev["b"])["rev"]
rev["a"] = call("docs.update", "update-a-2", id="a", title="final final a", _rev=rev["a"])["rev"]
print("DONE", flush=True)
"""
# What the store holds before AGENT's run, and after it.
BEFORE = {"kept": "original", "other": "untouched"}
AFTER_RUN = {"a": "final final a", "b": "final b", "c": "draft c", "kept": "changed twice",
             "other": "untouched"}
