"""Call plans (gateway/plan.py): compiled once per served manifest, swapped whole on a reload."""

from __future__ import annotations

from pathlib import Path

from unwind.gateway.catalogue import LocalCatalogue
from unwind.gateway.plan import Plans

MANIFESTS = """\
- tool: t.pay
  description: Keyed by the order, sent as the Idempotency-Key header.
  effect: idempotent
  permission: t:write
  idempotency: { key: "order-{{args.order}}", scope: global, carrier: { header: Idempotency-Key } }
  upstream: { url: "http://127.0.0.1:9/pay", method: POST, timeout_ms: 2s }
  retry: { attempts: 3, base_ms: 100, max_ms: 150 }
- tool: t.set
  description: Keyed, with a capture of what it changes.
  effect: compensable
  permission: t:write
  idempotency: { key: "set-{{args.id}}", scope: global, carrier: { argument: key } }
  capture: { tool: t.read, arguments: { id: $args.id } }
  upstream: { url: "http://127.0.0.1:9/set", method: POST }
  compensation:
    tool: t.restore
    residue: [the change was seen]
    argument_map: { id: $args.id, value: $before.value }
- tool: t.restore
  description: Puts the value back.
  effect: idempotent
  permission: t:write
  upstream: { url: "http://127.0.0.1:9/restore", method: POST }
- tool: t.read
  description: Reads what t.set changes.
  effect: read_only
  permission: t:write
  upstream: { url: "http://127.0.0.1:9/read", method: POST }
"""


def test_a_plan_holds_what_the_manifest_alone_decides(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(MANIFESTS)
    plans = Plans(LocalCatalogue([tmp_path / "m.yaml"]))
    pay, set_, read = plans.get("t.pay"), plans.get("t.set"), plans.get("t.read")
    assert pay is not None and set_ is not None and read is not None
    assert pay.together and pay.carrier_header == "Idempotency-Key" and pay.approval is None
    assert pay.call_ms == 3 * 2000 + 100 + 150  # three attempts and the backoffs between
    assert not set_.together and set_.carrier_argument == "key"  # a capture comes first
    assert read.read_only and not read.keyed and not read.together
    assert plans.get("t.nothing") is None
    assert plans.get("t.pay") is pay  # compiled once


def test_a_reload_swaps_every_plan_and_drops_the_tools_no_longer_served(tmp_path: Path) -> None:
    (tmp_path / "m.yaml").write_text(MANIFESTS)
    catalogue = LocalCatalogue([tmp_path / "m.yaml"])
    plans = Plans(catalogue)
    old = plans.get("t.pay")
    assert old is not None and old.deprecated is None
    (tmp_path / "m.yaml").write_text(MANIFESTS.replace(
        "  permission: t:write\n  idempotency: { key: \"order-",
        "  permission: t:write\n  lifecycle: deprecated\n  idempotency: { key: \"order-", 1)
        .replace("- tool: t.restore", "- tool: t.restored").replace("tool: t.restore\n",
                                                                     "tool: t.restored\n"))
    catalogue.load()
    new = plans.get("t.pay")
    assert new is not None and new is not old
    assert new.deprecated == "t.pay is deprecated"
    assert plans.get("t.restore") is None and plans.get("t.restored") is not None
