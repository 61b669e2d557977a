"""Issue 29, item 2: `unwind plan` says when an undo puts back only some of the fields a
call may change (pure: the plan's reason)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from unwind.ledger.entry import Entry, Handle, Times
from unwind.ledger.plan import Versions, make_plan
from unwind.manifest.canonical import checksum
from unwind.manifest.model import ToolManifest
from unwind.manifest.validate import validate_manifest

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)


def manifest(**fields: Any) -> ToolManifest:
    data = {"permission": "crm:write", "upstream": {"url": "http://127.0.0.1:9/x"}, **fields}
    m, issues = validate_manifest(data)
    assert m is not None and issues == [], issues
    return m


def update_email(schema: dict[str, Any] | None) -> ToolManifest:
    return manifest(tool="customers.update_email", effect="reversible",
                    **({"input_schema": schema} if schema is not None else {}),
                    capture={"tool": "customers.get", "arguments": {"id": "$args.id"}},
                    compensation={"tool": "customers.update_email", "kind": "inverse",
                                  "argument_map": {"id": "$args.id", "email": "$before.email"}})


def reason(m: ToolManifest) -> str:
    get = manifest(tool="customers.get", effect="read_only")
    versions = Versions({checksum(m): m, checksum(get): get}, {m.tool: m, get.tool: get})
    text = T0.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    entry = Entry(id="e1", seq=1, tool=m.tool, checksum=checksum(m), effect=str(m.effect),
                  actor="agent", state="succeeded",
                  handle=Handle(args={"id": "c1"}, before={"email": "old@example.com"}),
                  times=Times(requested=text, started=text, finished=text))
    [step] = make_plan("run-1", [entry], versions, now=T0 + timedelta(hours=1)).steps
    assert step.arguments == {"id": "c1", "email": "old@example.com"}
    return step.reason


def test_the_plan_says_an_undo_restores_only_the_email_when_a_call_may_also_change_the_role() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string"},
                                               "email": {"type": "string"},
                                               "role": {"type": "string"}}}
    said = reason(update_email(schema))
    assert said.endswith("; it restores only email: a call may also change role, which the "
                         "undo leaves as the call set them")


def test_an_undo_that_restores_every_field_a_call_may_change_says_nothing_more() -> None:
    schema = {"type": "object", "properties": {"id": {"type": "string"},
                                               "email": {"type": "string"}}}
    assert "restores only" not in reason(update_email(schema))


def test_without_a_schema_the_plan_says_nothing_bounds_what_a_call_changed() -> None:
    assert "it restores only email: the tool has no input_schema" in reason(update_email(None))
    open_schema = {"type": "object", "properties": {"email": {}}, "additionalProperties": True}
    assert "admits fields it does not name" in reason(update_email(open_schema))
