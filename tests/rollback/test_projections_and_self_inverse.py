"""Batches undone by a batch ([*] projections), expected values read from the call, a tool
that is its own inverse, and a read-back that cannot be evaluated (pure: no processes)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from unwind.ledger.entry import REDACTED, Entry, Handle, Times
from unwind.ledger.handle import build_handle, secret_texts, staged_handle
from unwind.ledger.plan import Versions, make_plan
from unwind.ledger.stepinput import step_input
from unwind.manifest.canonical import checksum
from unwind.manifest.model import ToolManifest
from unwind.manifest.validate import validate_manifest, validate_set
from unwind.undo.runner import parse_step, run_step
from unwind.upstream.client import Answer, Prepared
from unwind.upstream.secrets import LocalSecrets

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
URL = "http://127.0.0.1:9"


def manifest(**fields: Any) -> ToolManifest:
    data = {"permission": "p:w", "upstream": {"url": f"{URL}/{fields['tool']}"}, **fields}
    m, issues = validate_manifest(data)
    assert m is not None and issues == [], issues
    return m


CREATE = manifest(
    tool="memory.create_entities", effect="reversible",
    compensation={"tool": "memory.delete_entities", "kind": "inverse",
                  "argument_map": {"entityNames": "$args.entities[*].name"},
                  "verification": {"tool": "memory.open_nodes",
                                   "arguments": {"names": "$args.entities[*].name"},
                                   "expect": {"entities": []}}})
ITEMS = manifest(
    tool="shop.add_items", effect="compensable",
    compensation={"tool": "shop.remove_items", "argument_map": {"ids": "$result.items[*].id",
                                                                "skus": "$args.items[*].sku?"}})
MOVE = manifest(  # the safe form (issue 29, item 5): back to the folder read before the call
    tool="mail.move", effect="reversible",
    capture={"tool": "mail.get", "arguments": {"id": "$args.id"}},
    compensation={"tool": "mail.move", "kind": "inverse",
                  "argument_map": {"id": "$args.id", "from": "$args.to", "to": "$before.folder"},
                  "verification": {"tool": "mail.get", "arguments": {"id": "$args.id"},
                                   "expect": {"folder": "$before.folder", "moved_by": "$result.by",
                                              "label": "archive"}}})
TODAY = [CREATE, ITEMS, MOVE,
         *(manifest(tool=t, effect=e) for t, e in [("memory.delete_entities", "idempotent"),
                                                   ("memory.open_nodes", "read_only"),
                                                   ("shop.remove_items", "idempotent"),
                                                   ("mail.get", "read_only")])]
VERSIONS = Versions({checksum(m): m for m in TODAY}, {m.tool: m for m in TODAY})
ENTITIES = [{"name": "alice", "entityType": "person", "observations": ["likes tea"]},
            {"name": "bob", "entityType": "person", "observations": ["secret: 1234"]}]


def entry(m: ToolManifest, handle: Handle, eid: str = "e1") -> Entry:
    text = T0.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return Entry(id=eid, seq=1, tool=m.tool, checksum=checksum(m), effect=str(m.effect),
                 actor="agent", state="succeeded", handle=handle,
                 times=Times(requested=text, started=text, finished=text))


def only_step(m: ToolManifest, handle: Handle) -> Any:
    versions = Versions({**VERSIONS.by_checksum, checksum(m): m}, VERSIONS.tools)
    [step] = make_plan("run-1", [entry(m, handle)], versions, now=T0 + timedelta(hours=1)).steps
    return step


def test_the_handle_keeps_each_created_name_and_the_plan_deletes_them_all_in_one_call() -> None:
    handle = build_handle(CREATE, {"entities": ENTITIES}, {"ok": True}, strict=True)
    assert handle.args == {"entities": [{"name": "alice"}, {"name": "bob"}]}  # nothing else
    stored = Handle.model_validate_json(handle.model_dump_json())  # as the ledger keeps it
    step = only_step(CREATE, stored)
    assert (step.action, step.undo_tool) == ("inverse", "memory.delete_entities")
    assert step.arguments == {"entityNames": ["alice", "bob"]}
    assert step.verification.arguments == {"names": ["alice", "bob"]}


def test_a_batch_with_an_item_missing_the_projected_path_is_unrecoverable_and_says_which() -> None:
    args = {"entities": [ENTITIES[0], {"entityType": "person"}, ENTITIES[1]]}
    handle = build_handle(CREATE, args, {}, strict=True)
    step = only_step(CREATE, Handle.model_validate_json(handle.model_dump_json()))
    assert step.action == "unrecoverable"
    assert "entityNames: $args.entities[1] has no 'name'" in step.reason


def test_a_batch_whose_list_is_missing_is_unrecoverable() -> None:
    step = only_step(CREATE, build_handle(CREATE, {"entities": "alice"}, {}))
    assert step.action == "unrecoverable"
    assert "entityNames: $args has no 'entities'" in step.reason


def test_an_empty_batch_is_undone_by_an_empty_batch() -> None:
    step = only_step(CREATE, build_handle(CREATE, {"entities": []}, {}))
    assert step.arguments == {"entityNames": []}


def test_a_projection_over_the_answer_is_kept_and_an_optional_one_with_a_gap_is_left_out() -> None:
    args = {"items": [{"sku": "a"}, {"qty": 2}]}
    handle = build_handle(ITEMS, args, {"items": [{"id": 7, "price": 3}, {"id": 8}]})
    assert handle.result == {"items": [{"id": 7}, {"id": 8}]}
    step = only_step(ITEMS, Handle.model_validate_json(handle.model_dump_json()))
    assert step.action == "compensate"
    assert step.arguments == {"ids": [7, 8]}  # skus dropped as a whole, never ["a"]


def test_a_projected_redaction_masks_that_field_of_every_item_and_keeps_the_rest() -> None:
    m = ToolManifest.model_validate({**CREATE.model_dump(),
                                     "audit": {"redaction": ["$args.entities[*].observations"]}})
    assert set(secret_texts(m, {"entities": ENTITIES})) == {"likes tea", "secret: 1234"}
    handle = build_handle(m, {"entities": ENTITIES}, {})
    assert handle.args == {"entities": [{"name": "alice"}, {"name": "bob"}]}
    assert only_step(m, handle).arguments == {"entityNames": ["alice", "bob"]}


def test_a_redacted_item_field_an_undo_projects_makes_the_undo_unavailable() -> None:
    for masked in ("$args.entities[*].name", "$args.entities[1].name", "$args.entities"):
        m = ToolManifest.model_validate({**CREATE.model_dump(), "audit": {"redaction": [masked]}})
        handle = build_handle(m, {"entities": ENTITIES}, {})
        assert REDACTED in str(handle.args), masked
        step = only_step(m, handle)
        assert step.action == "unrecoverable", masked
        assert "audit.redaction masks" in step.reason


def test_a_redaction_reaches_items_that_have_the_field_even_when_others_do_not() -> None:
    m = ToolManifest.model_validate({**CREATE.model_dump(),
                                     "audit": {"redaction": ["$args.entities[*].token"]}})
    texts = secret_texts(m, {"entities": [{"name": "a"}, {"name": "b", "token": "tok_9"}]})
    assert texts == ["tok_9"]


def test_a_drafts_projected_handle_is_kept_as_a_list_and_masked_item_by_item() -> None:
    m = manifest(tool="docs.draft_batch", effect="irreversible",
                 audit={"redaction": ["$result.drafts[*].secret"]},
                 draft={"tool": "docs.draft_batch", "handle": {"ids": "$result.drafts[*].id",
                                                                "all": "$result.drafts[*]"},
                        "promote": "docs.publish", "discard": "docs.discard"})
    result = {"drafts": [{"id": 1, "secret": "s1"}, {"id": 2, "secret": "s2"}]}
    assert staged_handle(m, {}, result, []) == {
        "ids": [1, 2], "all": [{"id": 1, "secret": REDACTED}, {"id": 2, "secret": REDACTED}]}


# ---- a tool that is its own inverse; expected values read from the call ----

def test_a_move_is_undone_by_moving_back_to_the_folder_read_before_it_whatever_the_agent_said() -> None:
    assert validate_set(TODAY) == []
    handle = build_handle(MOVE, {"id": "m1", "from": "spam", "to": "archive"}, {"by": "agent"},
                          before={"folder": "inbox"})  # the agent's "from" was false
    assert handle.args == {"id": "m1", "to": "archive"}
    assert handle.before == {"folder": "inbox"}
    assert handle.result == {"by": "agent"}  # an expected value's reference is kept too
    step = only_step(MOVE, handle)
    assert (step.action, step.undo_tool) == ("inverse", "mail.move")
    assert step.arguments == {"id": "m1", "from": "archive", "to": "inbox"}
    assert step.verification.expect == {"folder": "inbox", "moved_by": "agent", "label": "archive"}
    spec = step_input("run-1", step, entry(MOVE, handle), VERSIONS, identity="uid:/u1")
    assert spec["verification"]["expect"] == {"folder": "inbox", "moved_by": "agent",
                                              "label": "archive"}


def test_an_expected_value_missing_from_the_handle_means_the_read_back_cannot_be_built() -> None:
    handle = build_handle(MOVE, {"id": "m1", "to": "archive", "from": "inbox"}, {},
                          before={"folder": "inbox"})
    step = only_step(MOVE, handle)
    assert step.action == "unrecoverable"
    assert "the read-back cannot be built: expect moved_by: $result has no 'by'" in step.reason


@pytest.mark.parametrize(("undo", "says"), [
    ({"kind": "compensation"}, "only as its own exact inverse"),
    ({"argument_map": {"id": "$args.id", "from": "$args.from", "to": "$args.to"}},
     "same arguments"),
    ({"argument_map": {}}, "same arguments"),
])
def test_a_tool_that_would_repeat_itself_is_refused_as_its_own_undo(
        undo: dict[str, Any], says: str) -> None:
    data = MOVE.model_dump(exclude_none=True)
    data["compensation"] = {**data["compensation"], **undo}
    _, issues = validate_manifest(data)
    assert [(i.path, says in i.message) for i in issues] == [("compensation.tool", True)]


# ---- a read-back that cannot be evaluated ends undo_failed, with why ----

class FakeUpstream:
    """Answers every call with ``answers`` in turn; raises when one is an exception."""

    def __init__(self, *answers: Answer | Exception) -> None:
        self.answers = list(answers)
        self.sent: list[Prepared] = []

    async def send(self, prepared: Prepared) -> Answer:
        self.sent.append(prepared)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def move_step(expect: dict[str, Any]) -> dict[str, Any]:
    get = {"tool": "mail.get", "effect": "read_only", "permission": "p:r",
           "upstream": {"url": f"{URL}/get", "method": "GET"}}
    return {"version": 1, "ledger": "run-1",
            "step": {"entry": "e1", "tool": "mail.move", "action": "inverse",
                     "undo_tool": "mail.move", "arguments": {"id": "m1", "to": "inbox"},
                     "residue": [], "requires_approval": False, "reason": "test"},
            "idempotency_key": "unwind-inverse-0123", "manifest": MOVE.canonical_dict(),
            "verification": {"manifest": get, "arguments": {"id": "m1"}, "expect": expect,
                             "retries": 3, "backoff_ms": 1},
            "timeout_ms": None, "effect": None}


async def test_an_expect_path_that_does_not_parse_ends_the_step_undo_failed_at_once() -> None:
    upstream = FakeUpstream(Answer("ok", 200, {"ok": True}), Answer("ok", 200, {"folder": "x"}))
    result = await run_step(parse_step(move_step({"folder..name": "inbox"})), upstream,  # type: ignore[arg-type]
                            LocalSecrets())
    assert (result["ok"], result["outcome"], result["entry_state"]) == \
        (False, "undo_failed", "undo_failed")
    assert "the read-back mail.get cannot be evaluated" in result["reason"]
    assert "folder..name" in result["first_mismatch"]
    assert len(upstream.sent) == 2  # no retries: the same path cannot parse next time


async def test_anything_the_step_cannot_complete_ends_it_undo_failed_never_left_undoing() -> None:
    upstream = FakeUpstream(Answer("ok", 200, {"ok": True}), RuntimeError("socket closed"))
    result = await run_step(parse_step(move_step({"folder": "inbox"})), upstream,  # type: ignore[arg-type]
                            LocalSecrets())
    assert (result["outcome"], result["entry_state"]) == ("undo_failed", "undo_failed")
    assert "RuntimeError: socket closed" in result["reason"]
    assert "the undo call was sent" in result["reason"]


async def test_a_step_that_fails_before_its_undo_call_says_nothing_was_called() -> None:
    upstream = FakeUpstream(ValueError("bad answer"))
    result = await run_step(parse_step(move_step({"folder": "inbox"})), upstream,  # type: ignore[arg-type]
                            LocalSecrets())
    assert (result["outcome"], result["entry_state"]) == ("undo_failed", "undo_failed")
    assert "ValueError: bad answer); nothing was called" in result["reason"]
