"""One failing ledger stays its own, without a cluster: the status the operator writes is
one the API server keeps as sent (api.crd.storable), a ledger whose pass fails is recorded
on it and the others go on (jobs.py, ledgerfailures.py, handlers.decide_ledgers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from tests.model_values import value_for
from unwind.api.crd import status_schema, storable, storable_status
from unwind.api.resources import LedgerStatus
from unwind.ledger.entry import ApprovalDecision, ApprovalRulesRecord, Entry, EntryApproval, Times
from unwind.ledger.plan import Versions
from unwind.operator import handlers
from unwind.operator.jobs import (
    PassResult,
    RollbackConfig,
    RollbackLoop,
    RollbackWorker,
    storable_entry,
)
from unwind.operator.ledgerfailures import failed_ledger, permanent, retry_after, written_again
from unwind.operator.rollback import Context, LedgerView, Reason, decide

NOW = "2026-12-02T10:00:00Z"


# ---- what the API server keeps ----------------------------------------------------------

def server_objections(value: Any, schema: dict[str, Any], path: str = "status") -> Iterator[str]:
    """What this API server (1.20, go-openapi's type check) does not keep as sent: an empty
    string in a non-nullable ``type: string`` is refused as ``Invalid value: "null"``, a
    null in a non-nullable field is pruned, a value an enum does not list (null included)
    is refused. Open parts (preserve-unknown-fields) are data."""
    if schema.get("x-kubernetes-preserve-unknown-fields") and not schema.get("properties"):
        return
    if not schema.get("nullable") and (value is None or (value == "" and schema.get("type") == "string")):
        yield f"{path}: {value!r}"
        return
    if "enum" in schema and value not in schema["enum"]:
        yield f"{path}: {value!r} not in the enum"
        return
    if isinstance(value, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, item in value.items():
            sub = (props or {}).get(key) if props is not None else extra if isinstance(extra, dict) else None
            if sub is not None:
                yield from server_objections(item, sub, f"{path}.{key}")
    elif isinstance(value, list):
        for item in value:
            yield from server_objections(item, schema.get("items") or {}, path)


@pytest.mark.parametrize("mode", ["bare", "skeleton", "full"])
def test_every_field_of_a_ledger_status_is_written_as_the_api_server_keeps_it(mode: str) -> None:
    model = LedgerStatus.model_validate(value_for(LedgerStatus, mode))
    dumped = model.model_dump(mode="json")  # None and "" defaults included, as a careless writer sends
    written = storable_status("EffectLedger", dumped)
    assert list(server_objections(written, status_schema("EffectLedger"))) == []
    assert LedgerStatus.model_validate(written) == model  # reads back the same
    if mode == "full":
        assert written["entries"][0]["handle"]["args"] == {"note": "", "none": None}  # data is kept whole
    if mode == "skeleton":  # every nested model, its "" and None defaults as dumped: refused unless dropped
        assert "status.entries.approval.decisions.reason: ''" in list(server_objections(dumped, status_schema("EffectLedger")))


def test_an_approval_decision_without_a_reason_was_refused_as_null_and_is_written_without_it() -> None:
    decision = ApprovalDecision(name="dave-ok", user="dave", groups=["finance"], decision="approve",
                                created=NOW)  # kubectl unwind approve without --reason
    entry = Entry(id="charge-1", tool="stripe.create_charge", actor="agent", state="succeeded",
                  approval=EntryApproval(rules=ApprovalRulesRecord(roles=["finance"], quorum=2),
                                         identities="kubernetes", decisions=[decision], state="approved"),
                  times=Times(requested=NOW))
    schema = status_schema("EffectLedger")
    # the operator's rollback pass wrote entries as Entry.to_json() gives them: refused
    assert "status.entries.approval.decisions.reason: ''" in list(
        server_objections({"entries": [entry.to_json()]}, schema))
    written = storable_entry(entry.to_json())
    assert "reason" not in written["approval"]["decisions"][0]
    assert list(server_objections({"entries": [written]}, schema)) == []
    assert Entry.model_validate(written) == entry


def test_a_nullable_field_keeps_its_empty_string_and_open_data_stays_whole() -> None:
    schema = status_schema("EffectLedger")
    step = {"index": 1, "entry": "e", "tool": "t", "action": "inverse", "state": "pending",
            "arguments": {"note": "", "none": None}, "undo_tool": None, "message": ""}
    out = storable({"rollback": {"request": {"requested": True}, "generation": 1, "planned": NOW,
                                 "steps": [step]}}, schema)
    kept = out["rollback"]["steps"][0]
    assert kept["arguments"] == {"note": "", "none": None}
    assert "undo_tool" not in kept and kept["message"] == ""  # nullable: "" is kept; absent reads as None


# ---- a failed pass, recorded on its ledger -------------------------------------------------

def test_a_ledger_whose_status_is_refused_is_degraded_and_its_rollback_says_why_once() -> None:
    found = failed_ledger("checkout-8", 3, [], True, Reason.STATUS_WRITE_FAILED,
                          "422 Unprocessable Entity: status.entries.approval.decisions.reason", NOW)
    assert found.conditions is not None
    conds = {c["type"]: c for c in found.conditions}
    assert conds["Degraded"]["status"] == "True" and conds["Degraded"]["reason"] == "StatusWriteFailed"
    assert conds["RolledBack"]["status"] == "False" and conds["RolledBack"]["observedGeneration"] == 3
    assert "the other ledgers of the namespace go on" in conds["Degraded"]["message"]
    assert [(e.type, e.reason, e.kind) for e in found.events] == [("Warning", "StatusWriteFailed", "EffectLedger")]
    again = failed_ledger("checkout-8", 3, found.conditions, True, Reason.STATUS_WRITE_FAILED,
                          "422 Unprocessable Entity: status.entries.approval.decisions.reason", NOW)
    assert again.conditions is None and again.events == []  # a retry posts no second Event


def test_a_failure_outside_a_rollback_leaves_rolled_back_alone() -> None:
    found = failed_ledger("run-1", 1, [], False, Reason.RECONCILE_FAILED, "KeyError: 'x'", NOW)
    assert found.conditions is not None
    assert [c["type"] for c in found.conditions] == ["Degraded"]


def test_a_write_that_goes_through_clears_the_failure_it_recorded_and_only_that() -> None:
    failed = failed_ledger("run-1", 1, [], False, Reason.DECISIONS_WRITE_FAILED, "422", NOW).conditions
    assert failed is not None
    cleared = written_again(1, failed, Reason.DECISIONS_WRITE_FAILED, NOW)
    assert cleared is not None and cleared[0]["status"] == "False" and cleared[0]["reason"] == "NoFailures"
    assert written_again(1, failed, Reason.STATUS_WRITE_FAILED, NOW) is None


def test_a_pass_that_decides_a_ledger_again_clears_its_pass_failure() -> None:
    failed = failed_ledger("run-1", 2, [], True, Reason.STATUS_WRITE_FAILED, "422", NOW).conditions
    assert failed is not None
    view = LedgerView("run-1", "uid", "run-1", 2, None, None, failed, [], live=0)  # the request withdrawn
    d = decide(view, lambda: pytest.fail("no versions needed"), {}, {},
               Context("shop", datetime(2026, 12, 2, tzinfo=UTC), "unwind:test"))
    conds = {c["type"]: c for c in d.status["conditions"]}
    assert conds["Degraded"]["status"] == "False"
    assert conds["RolledBack"]["reason"] == "Cancelled"


def test_only_refusals_the_object_must_fix_are_permanent_and_retries_back_off_to_five_minutes() -> None:
    assert [s for s in (400, 403, 404, 409, 413, 422, 429, 500, 503, None) if permanent(s)] == [400, 403, 413, 422]
    assert [retry_after(n, 5.0) for n in (1, 2, 3, 10)] == [5.0, 10.0, 20.0, 300.0]


# ---- the rollback pass: one ledger refused, the other written -------------------------------

class FakeCustom:
    """The custom-objects API of a namespace with ledgers; refuses a status of ``refused``
    that holds a rollback (as the cluster test's webhook does)."""

    def __init__(self, ledgers: dict[str, dict[str, Any]], refused: set[str]) -> None:
        self.ledgers, self.refused = ledgers, refused
        self.replaced: list[str] = []
        self.patched: dict[str, Any] = {}

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str,
                                     name: str, **kw: Any) -> Any:
        if name not in self.ledgers:
            raise ApiException(status=404, reason="Not Found")
        return Answer(self.ledgers[name]) if kw.get("_preload_content") is False else self.ledgers[name]

    def replace_namespaced_custom_object_status(self, group: str, version: str, namespace: str, plural: str,
                                                name: str, body: Any, **_: Any) -> Any:
        if name in self.refused and "rollback" in body["status"]:
            exc = ApiException(status=422, reason="Unprocessable Entity")
            exc.body = json.dumps({"message": f'EffectLedger.unwind.dev "{name}" is invalid'})
            raise exc
        if "rollback" in body["status"]:
            self.replaced.append(name)
        else:
            self.patched[name] = body  # conditions only
        self.ledgers[name] = body
        return Answer(body)


class FakeCore:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def create_namespaced_event(self, namespace: str, body: Any, **_: Any) -> Any:
        self.events.append(body)
        return Answer(body)


class Answer:
    def __init__(self, body: Any) -> None:
        self.data = json.dumps(body).encode()

    def read(self) -> bytes:
        return self.data

    def release_conn(self) -> None:
        pass


def requested(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "generation": 2},
            "spec": {"run": name, "rollback": {"requested": True, "reason": "r"}}, "status": {"entries": []}}


def worker(custom: FakeCustom, core: FakeCore) -> RollbackWorker:
    w = RollbackWorker.__new__(RollbackWorker)
    w.config, w.trust, w.refused = RollbackConfig(image="unwind:test"), lambda: pytest.fail("no stamps here"), {}
    w.custom, w.core = custom, core
    w.jobs = lambda namespace: {}  # type: ignore[method-assign]
    w.versions = lambda namespace: Versions({}, {})  # type: ignore[method-assign]
    return w


def test_a_ledger_whose_status_the_api_server_refuses_does_not_stop_the_next_ones_rollback(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("unwind.operator.jobs.requester", lambda *a: {"problem": "no stamp"})
    custom, core = FakeCustom({"a-broken": requested("a-broken"), "b-fine": requested("b-fine")}, {"a-broken"}), FakeCore()
    result = worker(custom, core).reconcile("shop", frozenset({"a-broken", "b-fine"}))
    assert result.failed == {"a-broken"}
    assert custom.replaced == ["b-fine"]  # planned (an empty ledger: nothing to undo) and written
    rolled = {c["type"]: c for c in custom.ledgers["b-fine"]["status"]["conditions"]}["RolledBack"]
    assert rolled["status"] == "True"
    conds = {c["type"]: c for c in custom.patched["a-broken"]["status"]["conditions"]}
    assert conds["Degraded"]["reason"] == conds["RolledBack"]["reason"] == "StatusWriteFailed"
    assert 'EffectLedger.unwind.dev "a-broken" is invalid' in conds["RolledBack"]["message"]
    assert [(e["involvedObject"]["name"], e["reason"]) for e in core.events if e["type"] == "Warning"] == [
        ("a-broken", "StatusWriteFailed")]


def test_a_ledger_whose_decision_raises_is_its_own_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("unwind.operator.jobs.requester", lambda *a: {"problem": "no stamp"})
    real = decide

    def flaky(view: LedgerView, *args: Any) -> Any:
        if view.name == "a-bug":
            raise KeyError("steps")
        return real(view, *args)
    monkeypatch.setattr("unwind.operator.jobs.decide", flaky)
    custom, core = FakeCustom({"a-bug": requested("a-bug"), "b-fine": requested("b-fine")}, set()), FakeCore()
    result = worker(custom, core).reconcile("shop", frozenset({"a-bug", "b-fine"}))
    assert result.failed == {"a-bug"} and custom.replaced == ["b-fine"]
    assert custom.patched["a-bug"]["status"]["conditions"][0]["reason"] == "ReconcileFailed"


async def test_a_failed_ledger_is_retried_with_its_own_backoff_and_forgotten_once_it_passes() -> None:
    loop = RollbackLoop(worker(FakeCustom({}, set()), FakeCore()), poll=0.01)
    retried: list[tuple[str, set[str]]] = []
    loop._again = lambda namespace, names: retried.append((namespace, names))  # type: ignore[method-assign]
    loop._schedule("shop", {"a", "b"}, PassResult(failed={"a"}, again={"b"}))
    loop._schedule("shop", {"a"}, PassResult(failed={"a"}))
    assert loop.failures == {("shop", "a"): 2}  # the next retry waits twice as long
    await asyncio.sleep(0.1)
    assert sorted((ns, sorted(names)) for ns, names in retried) == [("shop", ["a"]), ("shop", ["a"]), ("shop", ["b"])]
    loop._schedule("shop", set(), PassResult())  # a pass over every ledger, none failed
    assert loop.failures == {}


# ---- the approvals' decisions, written ledger by ledger ----------------------------------

class FakeKube:
    def __init__(self, refused: set[str]) -> None:
        self.custom = FakeCustom({n: requested(n) for n in ("l-1", "l-2", "l-3")}, set())
        self.core = FakeCore()
        self.refused, self.written = refused, []

    def update_ledger(self, namespace: str, name: str, change: Any) -> int:
        if name in self.refused:
            exc = ApiException(status=422, reason="Unprocessable Entity")
            exc.body = json.dumps({"message": "refused"})
            raise exc
        self.written.append(name)
        return 1


def test_a_ledger_whose_decisions_cannot_be_written_does_not_stop_the_others(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "ledger_targets", lambda approvals: {"l-1", "l-2", "l-3"})
    monkeypatch.setattr(handlers, "decisions_for", lambda *a: {"e-1": ["a decision"]})
    kube = FakeKube({"l-1"})
    handlers.decide_ledgers(kube, "shop", [], None)  # type: ignore[arg-type]
    assert kube.written == ["l-2", "l-3"]
    conds = kube.custom.patched["l-1"]["status"]["conditions"]
    assert [(c["type"], c["status"], c["reason"]) for c in conds] == [("Degraded", "True", "DecisionsWriteFailed")]
    assert [e["reason"] for e in kube.core.events] == ["DecisionsWriteFailed"]


def test_a_temporary_failure_of_one_ledgers_decisions_retries_the_reconcile_after_the_others(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(handlers, "ledger_targets", lambda approvals: {"l-1", "l-2"})
    monkeypatch.setattr(handlers, "decisions_for", lambda *a: {"e-1": ["a decision"]})
    kube = FakeKube(set())

    def busy(namespace: str, name: str, change: Any) -> int:
        if name == "l-1":
            raise ApiException(status=503, reason="Service Unavailable")
        kube.written.append(name)
        return 1
    kube.update_ledger = busy  # type: ignore[method-assign]
    with pytest.raises(ApiException):
        handlers.decide_ledgers(kube, "shop", [], None)  # type: ignore[arg-type]
    assert kube.written == ["l-2"] and kube.custom.patched == {}


def test_no_optional_enum_of_the_generated_crds_is_nullable() -> None:
    """A nullable enum refuses the null it declares (the API server checks a kept null against
    the enum, and a CRD may not list null in one); a non-nullable one prunes it. Found
    writing ``scope: null`` through the API server."""
    from unwind.api.crd import crd_for
    from unwind.api.resources import KINDS

    def walk(node: Any) -> Iterator[str]:
        if isinstance(node, dict):
            if node.get("nullable") and "enum" in node:
                yield str(node["enum"])
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for value in node:
                yield from walk(value)
    assert [e for kind in KINDS for e in walk(crd_for(kind))] == []
