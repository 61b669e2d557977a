"""The simulation's tools: one of each kind the exactly-once protocol must get right.

- ``vault.wire``: irreversible, behind approval, keyed per actor (issue 26, bug 2);
- ``pay.charge``: compensable (refund) with a lookup by key, keyed globally (bugs 1, 5);
- ``box.create``: reversible (delete) with a lookup by key, keyed per run;
- ``cfg.set``: compensable (restore what its capture read), keyed per run, whose capture
  ``cfg.read`` may be slower than the gateway's ``lock_grace`` (bug 3).

Every call carries a ``call`` argument the harness makes unique per intent (a run, an
Idempotency-Key and arguments): the fake upstream attributes each effect to the call that
made it, which no ledger entry records (only the keys and handles are kept).
"""

from __future__ import annotations

from typing import Any

from unwind.gateway.catalogue import Served
from unwind.ledger.plan import Versions
from unwind.manifest.canonical import checksum
from unwind.manifest.model import ToolManifest
from unwind.manifest.validate import validate_manifest, validate_set

BASE = "http://upstream.sim"
PERMISSION = "sim:write"
READ_RETRY = {"attempts": 2, "base_ms": 500, "max_ms": 1000}


def _read(tool: str, path: str, **more: Any) -> dict[str, Any]:
    return {"tool": tool, "effect": "read_only", "permission": PERMISSION, "retry": READ_RETRY,
            "upstream": {"url": f"{BASE}/{path}", "method": "POST"}, **more}


def _keyed(template: str, scope: str) -> dict[str, Any]:
    return {"key": template, "scope": scope, "carrier": {"header": "Idempotency-Key"}}


SPECS: list[dict[str, Any]] = [
    {"tool": "vault.wire", "effect": "irreversible", "permission": PERMISSION,
     "approval": {"roles": ["finance"], "quorum": 1},
     "idempotency": _keyed("wire-{{args.order}}", "actor"),
     "lookup": {"tool": "vault.find", "by": "idempotency_key", "arguments": {"key": "$key"}},
     "timeout_ms": 10_000, "upstream": {"url": f"{BASE}/wire", "method": "POST"}},
    _read("vault.find", "wire/find"),
    {"tool": "pay.charge", "effect": "compensable", "permission": PERMISSION,
     "idempotency": _keyed("charge-{{args.order}}", "global"),
     "lookup": {"tool": "pay.find", "by": "idempotency_key", "arguments": {"key": "$key"}},
     "timeout_ms": 10_000,
     "compensation": {"tool": "pay.refund", "residue": ["the statement shows the charge"],
                      "argument_map": {"charge_id": "$result.id"},
                      "verification": {"tool": "pay.get", "arguments": {"id": "$result.id"},
                                       "expect": {"refunded": True}, "retries": 2,
                                       "backoff_ms": 500}},
     "upstream": {"url": f"{BASE}/charge", "method": "POST"}},
    _read("pay.find", "charge/find"),
    _read("pay.get", "charge/get"),
    {"tool": "pay.refund", "effect": "idempotent", "permission": PERMISSION,
     "timeout_ms": 10_000, "upstream": {"url": f"{BASE}/refund", "method": "POST"}},
    {"tool": "box.create", "effect": "reversible", "permission": PERMISSION,
     "idempotency": _keyed("box-{{args.name}}", "run"),
     "lookup": {"tool": "box.find", "by": "idempotency_key", "arguments": {"key": "$key"}},
     "timeout_ms": 10_000,
     "compensation": {"tool": "box.delete", "kind": "inverse",
                      "argument_map": {"id": "$result.id"},
                      "verification": {"tool": "box.get", "arguments": {"id": "$result.id"},
                                       "absent": {}, "retries": 2, "backoff_ms": 500}},
     "upstream": {"url": f"{BASE}/box", "method": "POST"}},
    _read("box.find", "box/find"),
    _read("box.get", "box/get"),
    {"tool": "box.delete", "effect": "idempotent", "permission": PERMISSION,
     "timeout_ms": 10_000, "upstream": {"url": f"{BASE}/box/delete", "method": "POST"}},
    {"tool": "cfg.set", "effect": "compensable", "permission": PERMISSION,
     "idempotency": _keyed("set-{{args.id}}", "run"),
     "capture": {"tool": "cfg.read", "arguments": {"id": "$args.id"}},
     "lookup": {"tool": "cfg.find", "by": "idempotency_key", "arguments": {"key": "$key"}},
     "timeout_ms": 10_000,
     "compensation": {"tool": "cfg.restore", "residue": ["readers saw the new value"],
                      "argument_map": {"change": "$result.change", "id": "$args.id",
                                       "value": "$before.value"}},
     "upstream": {"url": f"{BASE}/cfg", "method": "POST"}},
    # a capture may take long: 45 s per attempt, two attempts (the issue's "30 s plus retries")
    _read("cfg.read", "cfg/read", timeout_ms=45_000),
    _read("cfg.find", "cfg/find"),
    {"tool": "cfg.restore", "effect": "idempotent", "permission": PERMISSION,
     "timeout_ms": 10_000, "upstream": {"url": f"{BASE}/cfg/restore", "method": "POST"}},
]
# The tools an agent calls, and where the effect's id is in the answer ($result.<field>).
EFFECT_TOOLS = {"vault.wire": None, "pay.charge": "id", "box.create": "id", "cfg.set": "change"}


def manifests() -> list[ToolManifest]:
    out = []
    for spec in SPECS:
        m, issues = validate_manifest({"description": f"{spec['tool']} (simulation)", **spec})
        assert m is not None and not issues, (spec["tool"], issues)
        out.append(m)
    problems = validate_set(out)
    assert not problems, problems
    return out


class Catalogue:
    """The gateway's ``Catalogue`` over the manifests above (local mode, unsigned)."""

    def __init__(self, tools: list[ToolManifest]) -> None:
        self._by_tool = {m.tool: Served(m, checksum(m), m.version) for m in tools}

    ready = True
    problem = None
    generation = "sim"
    observe = False

    def get(self, tool: str) -> Served | None:
        return self._by_tool.get(tool)

    def tools(self) -> list[Served]:
        return sorted(self._by_tool.values(), key=lambda s: s.manifest.tool)

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def versions(tools: list[ToolManifest]) -> Versions:
    return Versions({checksum(m): m for m in tools}, {m.tool: m for m in tools})
