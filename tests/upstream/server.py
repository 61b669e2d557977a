"""A test upstream for the example manifests: charges, comments, issues and releases.

Real HTTP (aiohttp), in memory. It honours ``Idempotency-Key`` (the same key answers the
first call's answer again, without a second effect), counts every request by route, and
misbehaves on demand, per route, through its admin endpoint:

    POST /_admin/behave {"route": "comments.create", "mode": "fail"|"hang"|"drop"|"not_json"|"ok"
                         |"slow"|"empty", "status": 500, "delay": 0.1}
    GET  /_admin/requests     {"count": N, "by_route": {...}, "effects_by_route": {...},
                               "requests": [...]} (an effect: a 2xx answer that was not a replay)
    POST /_admin/watch        {"ledger_dir": DIR}: every request records the ledger entries
                              (id, tool, state) found in DIR at the moment it arrived;
                              {"kube": {"server", "token", "ca_file", "namespace"}}: the same
                              from the namespace's EffectLedgers on the API server
    POST /_admin/reset

``fail`` answers the status with the request body echoed in the error text (so a test can
see that the gateway masks redacted values); ``hang`` never answers; ``slow`` answers
as ``ok`` after ``delay`` seconds; ``drop`` applies the
effect and closes the connection without an answer; ``not_json`` applies it and answers
plain text; ``empty`` applies it and answers 200 with an empty body.

Like GitHub and Stripe, a thing that is gone (deleted, or never made) answers 404, to a
read and to a DELETE alike; a DELETE that removes something answers 204 No Content.

Run it for the quickstart: ``python -m tests.upstream.server [--port 8788]``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import ssl
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

DEFAULT_PORT = 8788
NO_CONTENT = object()  # a handler's answer: 204 with no body (as GitHub's DELETEs answer)
Handler = Callable[[web.Request, dict[str, Any]], Awaitable[Any]]


class Upstream:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.ids = itertools.count(1)
        self.charges: dict[str, dict[str, Any]] = {}
        self.comments: dict[int, dict[str, Any]] = {}
        self.issues: dict[int, dict[str, Any]] = {}
        self.releases: dict[int, dict[str, Any]] = {}
        self.replays: dict[tuple[str, str], Any] = {}
        self.behaviour: dict[str, dict[str, Any]] = {}
        self.counts: Counter[str] = Counter()
        self.effects: Counter[str] = Counter()  # handler runs that answered 2xx (not replays)
        self.requests: list[dict[str, Any]] = []
        self.ledger_dir: Path | None = None
        self.kube: dict[str, str] | None = None

    # ---- bookkeeping ----

    async def snapshot(self) -> list[dict[str, Any]]:
        if self.kube is not None:
            return await self.kube_snapshot(self.kube)
        if self.ledger_dir is None:
            return []
        from unwind.ledger.filestore import read_run
        from unwind.ledger.store import StoreUnavailable

        out = []
        for path in sorted(self.ledger_dir.glob("*.json")):
            try:  # a run's first page: its entries, with the journal's (its latest) applied
                run = json.loads(path.read_text())["spec"]["run"]
                if path.name != f"{run}.json":
                    continue
                pages = read_run(self.ledger_dir, run)
            except (OSError, ValueError, KeyError, TypeError, StoreUnavailable):
                continue
            for obj in pages:
                for e in obj.get("status", {}).get("entries", []):
                    out.append({"ledger": f"{obj['metadata']['name']}.json", "id": e.get("id"),
                                "tool": e.get("tool"), "state": e.get("state")})
        return out

    @staticmethod
    async def kube_snapshot(kube: dict[str, str]) -> list[dict[str, Any]]:
        """The entries of every EffectLedger in the namespace, as the API server has them
        now (the gateway under test cannot have written anything after this read)."""
        url = (f"{kube['server']}/apis/unwind.dev/v1alpha1/namespaces/{kube['namespace']}"
               "/effectledgers")
        ctx = ssl.create_default_context(cafile=kube["ca_file"])
        async with aiohttp.ClientSession() as session, session.get(
                url, headers={"Authorization": f"Bearer {kube['token']}"}, ssl=ctx) as r:
            body = await r.json()
        return [{"ledger": o["metadata"]["name"], "id": e.get("id"), "tool": e.get("tool"),
                 "state": e.get("state")}
                for o in body.get("items", []) for e in (o.get("status") or {}).get("entries", [])]

    def route(self, name: str, handler: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        async def serve(request: web.Request) -> web.StreamResponse:
            body: dict[str, Any] = {}
            if request.can_read_body:
                try:
                    body = await request.json()
                except ValueError:
                    return web.json_response({"error": "the body is not JSON"}, status=400)
            args = {**dict(request.query), **(body if isinstance(body, dict) else {})}
            self.counts[name] += 1
            self.requests.append({"route": name, "method": request.method, "path": request.path,
                                  "idempotency_key": request.headers.get("Idempotency-Key"),
                                  "authorization": request.headers.get("Authorization"),
                                  "arguments": args, "ledger": await self.snapshot()})
            behave = self.behaviour.get(name, {})
            mode = behave.get("mode", "ok")
            if mode == "hang":
                await asyncio.sleep(3600)
            if mode == "slow":  # then as ok
                await asyncio.sleep(float(behave.get("delay", 0.1)))
            if mode == "fail":
                return web.json_response(
                    {"error": f"{name} failed for {json.dumps(args, sort_keys=True)}"},
                    status=int(behave.get("status", 500)))
            key = request.headers.get("Idempotency-Key")
            if key and (name, key) in self.replays:
                answer = self.replays[(name, key)]
            else:
                answer = await handler(request, args)
                if isinstance(answer, web.StreamResponse):
                    return answer
                self.effects[name] += 1
                if key:
                    self.replays[(name, key)] = answer
            if mode == "drop":
                assert request.transport is not None
                request.transport.close()
                return web.Response(status=200)
            if mode == "not_json":
                return web.Response(text="OK, done", content_type="text/plain")
            if mode == "empty":
                return web.Response(status=200)  # Content-Length: 0
            if answer is NO_CONTENT:
                return web.Response(status=204)
            return web.json_response(answer)
        return serve

    # ---- the tools ----

    async def create_charge(self, request: web.Request, a: dict[str, Any]) -> Any:
        charge = {"id": f"ch_{next(self.ids)}", "order_id": a.get("order_id"),
                  "amount": a.get("amount"), "status": "paid", "refunded": False,
                  "idempotency_key": request.headers.get("Idempotency-Key")}
        self.charges[charge["id"]] = charge
        return charge

    async def get_charge(self, _: web.Request, a: dict[str, Any]) -> Any:
        for charge in self.charges.values():
            if a.get("charge_id") in (None, charge["id"]) and \
                    a.get("idempotency_key") in (None, charge["idempotency_key"]):
                return charge
        return web.json_response({"error": "no such charge"}, status=404)

    async def refund(self, request: web.Request, _: dict[str, Any]) -> Any:
        charge = self.charges.get(request.match_info["id"])
        if charge is None:
            return web.json_response({"error": "no such charge"}, status=404)
        charge["refunded"] = True
        return charge

    async def create_comment(self, request: web.Request, a: dict[str, Any]) -> Any:
        number = next(self.ids)
        self.comments[number] = {"id": number, "repo": a.get("repo"), "body": a.get("body"),
                                 "issue": a.get("issue")}
        return self.comments[number]

    async def get_comment(self, request: web.Request, _: dict[str, Any]) -> Any:
        comment = self.comments.get(int(request.match_info["id"]))
        return comment or web.json_response({"error": "no such comment"}, status=404)

    async def delete_comment(self, request: web.Request, _: dict[str, Any]) -> Any:
        if self.comments.pop(int(request.match_info["id"]), None) is None:
            return web.json_response({"error": "no such comment"}, status=404)
        return NO_CONTENT

    async def create_issue(self, _: web.Request, a: dict[str, Any]) -> Any:
        number = next(self.ids)
        self.issues[number] = {"number": number, "repo": a.get("repo"), "title": a.get("title"),
                               "state": "open"}
        return self.issues[number]

    async def get_issue(self, request: web.Request, _: dict[str, Any]) -> Any:
        issue = self.issues.get(int(request.match_info["number"]))
        return issue or web.json_response({"error": "no such issue"}, status=404)

    async def close_issue(self, request: web.Request, a: dict[str, Any]) -> Any:
        issue = self.issues.get(int(request.match_info["number"]))
        if issue is None:
            return web.json_response({"error": "no such issue"}, status=404)
        issue.update(state="closed", reason=a.get("reason"))
        return issue

    async def create_release(self, _: web.Request, a: dict[str, Any]) -> Any:
        number = next(self.ids)
        self.releases[number] = {"id": number, "repo": a.get("repo"), "tag": a.get("tag"),
                                 "name": a.get("name"), "draft": bool(a.get("draft", False))}
        return self.releases[number]

    async def get_release(self, _: web.Request, a: dict[str, Any]) -> Any:
        for release in self.releases.values():
            if (release["repo"], release["tag"]) == (a.get("repo"), a.get("tag")):
                return release
        return web.json_response({"error": "no such release"}, status=404)

    async def publish_release(self, request: web.Request, _: dict[str, Any]) -> Any:
        release = self.releases.get(int(request.match_info["id"]))
        if release is None:
            return web.json_response({"error": "no such release"}, status=404)
        release["draft"] = False
        return release

    async def delete_release(self, request: web.Request, _: dict[str, Any]) -> Any:
        if self.releases.pop(int(request.match_info["id"]), None) is None:
            return web.json_response({"error": "no such release"}, status=404)
        return NO_CONTENT

    # ---- admin ----

    async def behave(self, request: web.Request) -> web.Response:
        spec = await request.json()
        self.behaviour[spec["route"]] = spec
        return web.json_response({"ok": True})

    async def listing(self, _: web.Request) -> web.Response:
        return web.json_response({"count": sum(self.counts.values()), "by_route": self.counts,
                                  "effects_by_route": self.effects, "requests": self.requests})

    async def watch(self, request: web.Request) -> web.Response:
        spec = await request.json()
        if "kube" in spec:
            self.kube = {k: str(v) for k, v in spec["kube"].items()}
        else:
            self.ledger_dir = Path(spec["ledger_dir"])
        return web.json_response({"ok": True})

    async def do_reset(self, _: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"ok": True})

    def app(self) -> web.Application:
        app = web.Application()
        r = self.route
        app.add_routes([
            web.post("/charges", r("charges.create", self.create_charge)),
            web.get("/charges", r("charges.get", self.get_charge)),
            web.post("/charges/{id}/refund", r("charges.refund", self.refund)),
            web.post("/comments", r("comments.create", self.create_comment)),
            web.get("/comments/{id}", r("comments.get", self.get_comment)),
            web.delete("/comments/{id}", r("comments.delete", self.delete_comment)),
            web.post("/issues", r("issues.create", self.create_issue)),
            web.get("/issues/{number}", r("issues.get", self.get_issue)),
            web.post("/issues/{number}/close", r("issues.close", self.close_issue)),
            web.post("/releases", r("releases.create", self.create_release)),
            web.get("/releases", r("releases.get", self.get_release)),
            web.post("/releases/{id}/publish", r("releases.publish", self.publish_release)),
            web.delete("/releases/{id}", r("releases.delete", self.delete_release)),
            web.post("/_admin/behave", self.behave),
            web.get("/_admin/requests", self.listing),
            web.post("/_admin/watch", self.watch),
            web.post("/_admin/reset", self.do_reset),
        ])
        return app


def main() -> None:
    from unwind.cli.gateway_cmds import cannot_listen

    parser = argparse.ArgumentParser(description="The test upstream for the example manifests.")
    parser.add_argument("--host", action="append",
                        help="address to listen on (repeat for several; default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    args = parser.parse_args()
    hosts = args.host or ["127.0.0.1"]
    taken = next(((h, why) for h in hosts if (why := cannot_listen(h, args.port))), None)
    if taken:  # one line and exit 1: a gateway must never quietly meet another process's upstream
        print(f"error: cannot listen on {taken[0]}:{args.port}: {taken[1]} (a test upstream left "
              "running? stop it, or give --port)", file=sys.stderr)
        sys.exit(1)
    print(", ".join(f"test upstream on http://{h}:{args.port}" for h in hosts), flush=True)
    web.run_app(Upstream().app(), host=hosts, port=args.port, print=None)


if __name__ == "__main__":
    main()
