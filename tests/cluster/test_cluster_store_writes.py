"""The cluster store's conditional writes on the real API server: a JSON patch of the status
that sets metadata.resourceVersion is refused with 409 when the page changed since, exactly
like a PUT, so two stores writing one run never lose or reorder an entry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from unwind.controlplane import ControlPlane
from unwind.controlplane.dev import OperatorProcess
from unwind.gateway.kube import InClusterConfig, KubeClient
from unwind.ledger.clusterstore import ClusterStore
from unwind.ledger.entry import Entry, Times, stamp
from unwind.ledger.lifecycle import Expect, Write

ACTOR = "system:serviceaccount:t:agent"


class Recording:
    def __init__(self, kube: KubeClient) -> None:
        self.kube, self.seen = kube, []  # type: ignore[var-annotated]

    async def request(self, method: str, path: str, body: Any = None, **kw: Any) -> tuple[int, Any]:
        status, answer = await self.kube.request(method, path, body, **kw)
        self.seen.append((method, path.rsplit("/", 1)[-1], status))
        return status, answer


def outcome(state: str) -> Write:
    """The gateway's outcome write (through the entry lifecycle, as every write)."""
    return Write("gateway", Expect("pending"), lambda e: e.model_copy(update={"state": state}))


def entry(eid: str, state: str = "pending") -> Entry:
    return Entry(id=eid, tool="t.echo", actor=ACTOR, state=state,  # type: ignore[arg-type]
                 times=Times(requested=stamp()))


async def test_a_patch_on_an_old_resource_version_gets_409_and_the_store_writes_again(
        operator: OperatorProcess, control_plane: ControlPlane, namespace: str,
        tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(control_plane.admin_token)
    host, _, port = control_plane.server.removeprefix("https://").rpartition(":")
    config = InClusterConfig(f"https://{host}:{port}", token, control_plane.ca_file)
    kubes = [KubeClient(config), KubeClient(config)]
    a_api, b_api = Recording(kubes[0]), Recording(kubes[1])
    a, b = ClusterStore(a_api, namespace), ClusterStore(b_api, namespace)  # type: ignore[arg-type]
    try:
        await a.create("run-1", entry("a-1"))  # POST the page, PUT its first entries
        await a.transition("run-1", "a-1", outcome("succeeded"))
        await b.create("run-1", entry("b-1"))  # b reads the page, patches it
        a_api.seen.clear()
        await a.create("run-1", entry("a-2"))  # a's copy is old: 409, read, patch again
        assert [(m, s) for m, _, s in a_api.seen] == [("PATCH", 409), ("GET", 200), ("PATCH", 200)]
        await b.transition("run-1", "b-1", outcome("failed"))
        stored = await a.entries("run-1")
        assert [(e.id, e.seq, e.state) for e in stored] == [
            ("a-1", 1, "succeeded"), ("b-1", 2, "failed"), ("a-2", 3, "pending")]
        assert await a.get("run-1", "b-1") == stored[1]
    finally:
        for kube in kubes:
            await kube.aclose()
