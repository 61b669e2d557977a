"""The step runner's calls: one request through the gateway's ``prepare`` and
``Upstream.send``, and how an answer is told in a sentence."""

from __future__ import annotations

import json
from typing import Any

from ..manifest.model import ToolManifest
from ..upstream.client import Answer, Upstream, prepare
from ..upstream.errors import Refusal
from ..upstream.secrets import Secrets


async def send(m: ToolManifest, args: dict[str, Any], secrets: Secrets, headers: dict[str, str],
                upstream: Upstream) -> Answer:
    try:
        prepared = prepare(m, args, secrets, headers)
    except Refusal as refusal:
        return Answer("not_sent", text=refusal.message, sent=False)
    return await upstream.send(prepared)


def call_record(a: Answer) -> dict[str, Any]:
    return {"status": a.status, "kind": a.kind, "attempts": a.attempts}


def failure(a: Answer) -> str:
    if a.kind == "error_status":
        body = json.dumps(a.data, sort_keys=True)[:300] if a.data is not None else a.text[:300]
        return f"the upstream answered {a.status}: {body}"
    if a.kind == "not_json":
        return f"the upstream answered {a.status} with a body that is not JSON"
    return a.text or a.kind
