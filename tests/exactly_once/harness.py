"""The pieces the exactly-once tests put together, all in one process and one event loop, so
each interleaving happens in the order the test says:

- the test upstream (tests/upstream/server.py) served over real HTTP, with **gates**: the
  first requests to a route wait, already counted but not applied, until the test
  releases them (a call in flight whose effect has not happened yet);
- a gateway (``Gateway``, the enforcement path both doors use) over a ledger folder or over
  the cluster store talking to a fake API server with real resourceVersion semantics
  (tests/gateway/test_cluster_round_trips.py), with a clock the test can move;
- the local rollback (``undo.local.execute``, what ``unwind rollback`` runs), and the
  operator's rollback as its passes: the pure ``operator.rollback.decide`` over the ledger
  as the fake API server holds it, its writes applied there, and each Job run at once by
  the step runner (``unwind undo-step``'s code).

Only interfaces that existed before issue 26 are required, so the same tests run against
the code before it (the known bugs) and after.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web

from tests.fake_apiserver import FakeApiServer
from tests.upstream import server as upstream_server
from unwind.gateway.catalogue import LocalCatalogue
from unwind.gateway.enforce import CallRequest, CallResult, Gateway, Settings
from unwind.ledger.clusterstore import ClusterStore, LeaseLocks, compact_entry
from unwind.ledger.entry import ApprovalDecision, Entry, stamp
from unwind.ledger.filestore import FileLocks, FileStore
from unwind.ledger.plan import Selection, Versions
from unwind.ledger.store import Holder, lock_name
from unwind.operator.ledgers import decide_entries
from unwind.operator.rollback import Context, Decision, JobView, LedgerView, decide
from unwind.undo.local import execute, open_ledger, plan_local
from unwind.undo.runner import parse_step, run_step
from unwind.undo.sources import load_versions
from unwind.upstream.client import Upstream
from unwind.upstream.secrets import LocalSecrets

HERE = Path(__file__).parent
NS = "agents"  # the fake API server's namespace
ACTOR = "agent"
SCOPES = frozenset({"pay:read", "pay:write"})


@dataclass
class Gate:
    hold: int  # how many requests still to hold
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)


class GatedUpstream(upstream_server.Upstream):
    """The test upstream, whose routes can hold requests before they take effect."""

    def reset(self) -> None:
        super().reset()
        self.gates: dict[str, Gate] = {}

    def gate(self, route: str, hold: int = 1) -> Gate:
        self.gates[route] = Gate(hold)
        return self.gates[route]

    def route(self, name: str, handler: upstream_server.Handler) -> Any:
        async def gated(request: web.Request, a: dict[str, Any]) -> Any:
            gate = self.gates.get(name)
            if gate is not None and gate.hold > 0:
                gate.hold -= 1
                gate.arrived.set()
                await gate.release.wait()
            return await handler(request, a)
        return super().route(name, gated)

    def refunds(self, charge_id: str) -> int:
        return sum(1 for r in self.requests if r["route"] == "charges.refund"
                   and r["path"] == f"/charges/{charge_id}/refund")


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[tuple[GatedUpstream, str]]:
    up = GatedUpstream()
    runner = web.AppRunner(up.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield up, f"http://127.0.0.1:{port}"
    finally:
        for gate in up.gates.values():
            gate.release.set()
        await runner.cleanup()


def tools(folder: Path, base: str) -> Path:
    path = folder / "tools.yaml"
    path.write_text((HERE / "tools.yaml").read_text().replace("BASE", base))
    return path


class Clock:
    """The real clock, which the test can move forward (every party sharing it moves)."""

    def __init__(self) -> None:
        self.offset = timedelta(0)

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)


class ApiServer(FakeApiServer):
    """The fake API server, stamping each object's creationTimestamp when it is created, as
    the real one does (the ledgers' ages count for --max-runs)."""

    def handle(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        status, obj = super().handle(method, path, body)
        if method == "POST" and status == 201:
            kind = path.partition("?")[0].strip("/").split("/")[5]
            made = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            self.objects[(kind, obj["metadata"]["name"])]["metadata"]["creationTimestamp"] = made
            obj["metadata"]["creationTimestamp"] = made
        return status, obj


def call(tool: str, arguments: dict[str, Any], run: str, entry: str) -> CallRequest:
    return CallRequest(tool, arguments, run, entry)


# ---- the two stores, behind one face ----

class Ledgers:
    """Where the gateway writes: a ledger folder, or EffectLedgers on a fake API server."""

    kind: str

    def gateway(self, manifests: Path, clock: Callable[[], datetime] | None = None,
                **settings: Any) -> Gateway:
        raise NotImplementedError

    def entries(self, run: str) -> dict[str, Entry]:
        raise NotImplementedError

    def ledgers(self) -> list[str]:
        raise NotImplementedError

    def add_pending(self, run: str, entry: Entry) -> None:
        """An entry exactly as a gateway killed right after its write-ahead leaves it."""
        raise NotImplementedError

    async def approve(self, run: str, entry_id: str, user: str) -> None:
        raise NotImplementedError

    async def roll_back(self, run: str, manifests: Path) -> None:
        """Roll ``run`` back (``unwind rollback``, or the operator's passes), while the
        event loop lets calls in flight go on."""
        raise NotImplementedError

    def lock(self, run: str, tool: str, key: str, scope: str = "global") -> Holder | None:
        raise NotImplementedError


def _gateway(catalogue: Path, store: Any, locks: Any, clock: Callable[[], datetime] | None,
             settings: dict[str, Any]) -> Gateway:
    kw: dict[str, Any] = {"clock": clock} if clock is not None else {}
    return Gateway(LocalCatalogue([catalogue]), store, locks, Upstream(), LocalSecrets(),
                   Settings(scopes=SCOPES, actor=ACTOR, **settings), **kw)


class Folder(Ledgers):
    kind = "folder"

    def __init__(self, root: Path) -> None:
        self.root = root

    def gateway(self, manifests: Path, clock: Callable[[], datetime] | None = None,
                **settings: Any) -> Gateway:
        return _gateway(manifests, FileStore(self.root), FileLocks(self.root), clock, settings)

    def entries(self, run: str) -> dict[str, Entry]:
        return {e.id: e for e in FileStore(self.root).entries_sync(run)}

    def ledgers(self) -> list[str]:
        return sorted(p.stem for p in self.root.glob("*.json") if ".p" not in p.stem
                      and not p.name.endswith(".rollback.json"))

    def add_pending(self, run: str, entry: Entry) -> None:
        FileStore(self.root).create_sync(run, entry)

    async def approve(self, run: str, entry_id: str, user: str) -> None:
        from rollback.conftest import unwind
        ran = unwind("approve", "--ledger", self.root / f"{run}.json", "--entry", entry_id,
                     "--by", user, "--group", "finance")
        assert ran.code == 0, ran.err

    async def roll_back(self, run: str, manifests: Path) -> None:
        ledger = open_ledger(self.root / f"{run}.json")
        versions = load_versions([str(manifests)])
        plan = plan_local(ledger, versions, Selection())

        async def no_wait(_: float) -> None:
            await asyncio.sleep(0)
        summary = await execute(ledger, plan, versions, Selection(), by="oncall",
                                secrets=LocalSecrets(), report=lambda step, result: None,
                                sleep=no_wait)
        assert summary.ok, summary.stopped

    def lock(self, run: str, tool: str, key: str, scope: str = "global") -> Holder | None:
        path = self.root / ".locks" / f"{lock_name(scope, run=run, actor=ACTOR, tool=tool, key=key)}.key"  # type: ignore[arg-type]
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return Holder(data["run"], data["entry"], data["since"])


class Cluster(Ledgers):
    kind = "cluster"

    def __init__(self) -> None:
        self.server = ApiServer(delay=0.002)
        self.jobs: dict[str, JobView] = {}

    def gateway(self, manifests: Path, clock: Callable[[], datetime] | None = None,
                **settings: Any) -> Gateway:
        api = self.server.client()
        return _gateway(manifests, ClusterStore(api, NS), LeaseLocks(api, NS), clock, settings)

    def entries(self, run: str) -> dict[str, Entry]:
        return {e.id: e for e in self.server.entries(run)}

    def ledgers(self) -> list[str]:
        return sorted(name for (kind, name) in self.server.objects
                      if kind == "effectledgers" and ".p" not in name)

    def _page(self, run: str) -> dict[str, Any]:
        obj = self.server.ledger(run)
        assert obj is not None, f"no ledger {run}"
        return obj

    def _bump(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = self.server._next_rv()

    def add_pending(self, run: str, entry: Entry) -> None:
        page = self._page(run)
        entries = page.setdefault("status", {}).setdefault("entries", [])
        entries.append(compact_entry(entry.model_copy(update={"seq": len(entries) + 1}).to_json()))
        self._bump(page)

    async def approve(self, run: str, entry_id: str, user: str) -> None:
        page = self._page(run)
        made = ApprovalDecision(name=f"ap-{user}-{entry_id}", user=user, groups=["finance"],
                                decision="approve", created=stamp())
        decided = decide_entries(run, page["status"]["entries"], {entry_id: [made]},
                                 datetime.now(UTC))
        assert decided is not None, "the approval changed nothing"
        page["status"]["entries"] = decided
        self._bump(page)

    def request(self, run: str) -> None:
        """`kubectl unwind rollback ledger/RUN`: spec.rollback, a new generation."""
        page = self._page(run)
        page["spec"]["rollback"] = {"requested": True, "reason": "stop it", "entries": [],
                                    "requestedAt": stamp()}
        page["metadata"]["generation"] = int(page["metadata"].get("generation") or 1) + 1
        self._bump(page)

    def lock(self, run: str, tool: str, key: str, scope: str = "global") -> Holder | None:
        name = lock_name(scope, run=run, actor=ACTOR, tool=tool, key=key)  # type: ignore[arg-type]
        lease = self.server.objects.get(("leases", "unwind-key-" + name))
        if lease is None:
            return None
        notes = lease["metadata"].get("annotations") or {}
        return Holder(notes.get("unwind.dev/run", ""), lease["spec"]["holderIdentity"],
                      notes.get("unwind.dev/since", ""))

    async def roll_back(self, run: str, manifests: Path) -> None:
        self.request(run)
        versions = load_versions([str(manifests)])
        for _ in range(200):
            d = await self.operator_pass(run, versions)
            page = self._page(run)
            rb = (page.get("status") or {}).get("rollback") or {}
            if rb.get("finished") and rb.get("generation") == page["metadata"]["generation"]:
                assert not [s for s in rb["steps"] if s["state"] == "failed"], rb["steps"]
                return
            await asyncio.sleep(0.01 if not getattr(d, "waiting", False) else 0.05)
        raise AssertionError(f"the rollback of {run} did not finish: {self._page(run).get('status')}")

    def _pages(self, run: str) -> list[dict[str, Any]]:
        out, name = [], run
        while name:
            obj = self.server.ledger(name)
            if obj is None:
                break
            out.append(obj)
            name = (obj.get("status") or {}).get("next")
        return out

    def _holders(self, run: str, entries: list[Entry]) -> dict[str, Holder | None]:
        out: dict[str, Holder | None] = {}
        for e in entries:
            if e.state == "pending" and e.key is not None and e.scope is not None:
                out[e.id] = self.lock(run, e.tool, e.key, e.scope)
        return out

    async def operator_pass(self, run: str, versions: Versions) -> Decision:
        """One pass of the operator over the ledger (operator/jobs.py's gather, decide, write),
        its writes applied at once (no await in between: nothing else writes meanwhile), and
        the Jobs it creates run to completion by the step runner."""
        pages = self._pages(run)
        first = pages[0]
        entries = [Entry.model_validate(e) for p in pages for e in (p.get("status") or {}).get("entries") or []]
        meta, spec, status = first["metadata"], first["spec"], first.get("status") or {}
        view = LedgerView(meta["name"], meta["uid"], run, int(meta.get("generation") or 1),
                          spec.get("rollback"), status.get("rollback"),
                          list(status.get("conditions") or []), entries, live=status.get("live"))
        fields = getattr(view, "__dataclass_fields__", {})
        if "fenced_pages" in fields:  # the fence and the holders (issue 26)
            view.pages = len(pages)  # type: ignore[attr-defined]
            view.fenced_pages = sum(1 for p in pages if (p.get("status") or {}).get("fence"))  # type: ignore[attr-defined]
            view.holders = self._holders(run, entries)  # type: ignore[attr-defined]
        d = decide(view, lambda: versions, self.jobs, {}, Context(NS, datetime.now(UTC), "unwind:test", 4))
        for page in reversed(pages):
            raw = list((page.get("status") or {}).get("entries") or [])
            new = []
            for item in raw:
                change = d.changes.get(str(item.get("id")))
                if change is not None:
                    with contextlib.suppress(Exception):
                        item = compact_entry(change(Entry.model_validate(item)).to_json())
                new.append(item)
            page.setdefault("status", {})["entries"] = new
            fence = getattr(d, "fence", None)
            if fence and not page["status"].get("fence"):
                page["status"]["fence"] = fence
            if page is first:
                page["status"].update(copy.deepcopy(d.status))
            self._bump(page)
        for body in d.jobs:
            name = body["metadata"]["name"]
            env = body["spec"]["template"]["spec"]["containers"][0]["env"]
            spec_in = parse_step(json.loads(next(e["value"] for e in env if e["name"] == "UNWIND_STEP")))
            client = Upstream()
            try:
                result = await run_step(spec_in, client, LocalSecrets())
            finally:
                await client.aclose()
            self.jobs[name] = JobView(name, "succeeded" if result.get("ok") else "failed",
                                      json.dumps(result))
        return d


async def answer(gw: Gateway, req: CallRequest) -> CallResult:
    return await gw.call(req)


async def close(*gateways: Gateway) -> None:
    for gw in gateways:
        closing = getattr(gw.store, "aclose", None)
        if closing is not None:
            await closing()
        await gw.upstream.aclose()
