"""The validator: one pure function for one manifest and one for a set.

Each rule is a small function named after what it enforces, yielding ``(field path,
message)`` pairs; ``MANIFEST_RULES`` and ``SET_RULES`` are the ordered tables. The CLI, the
admission webhook, the operator and the gateway all call ``validate_manifest`` and
``validate_set`` (through ``validate_namespace`` where lifecycles matter) and nothing else,
so they cannot disagree.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from .input_schema import schema_problems
from .issues import Issue, format_path, input_path, issues_from_validation_error, without_paths
from .mcp_names import mcp_name
from .model import TOOL_NAME_PATTERN, UNDOABLE, Effect, Lifecycle, ToolManifest
from .places import READER_PLACES, names_at
from .refs import EACH, RefSyntaxError, answer_path, expected_reference, parse_ref
from .undo_refs import before_reference, overlaps, redaction_references

Finding = tuple[str, str]
Rule = Callable[[ToolManifest], Iterator[Finding]]

_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)
_PLACEHOLDER = re.compile(r"\{\{\s*([^}]*?)\s*\}\}")
_ARGS_PLACEHOLDER = re.compile(r"args\.[A-Za-z0-9_\-]+(\.[A-Za-z0-9_\-]+)*")  # fullmatch
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")  # fullmatch
_ARGUMENT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # fullmatch
_ROOT_WORDS = {"args": "$args", "result": "$result", "key": "$key", "const": "a {const: ...} literal",
               "before": "$before (the captured state)",
               "current": "$current (the state read right before the undo)"}


def _a(word: str) -> str:
    """The word with its indefinite article: a compensable, an irreversible."""
    return f"{'an' if word[:1].lower() in 'aeiou' else 'a'} {word}"


def _name_problem(name: str) -> str | None:
    if len(name) > 128:
        return f"is {len(name)} characters long; the limit is 128"
    if _TOOL_NAME.fullmatch(name):  # fullmatch: `$` alone also matches before a final "\n"
        return None
    hidden = next(((i, ch) for i, ch in enumerate(name)
                   if unicodedata.category(ch) in ("Cc", "Cf", "Zl", "Zp")), None)
    if hidden is not None:
        i, ch = hidden
        return (f"{name!r} has a control character or line break (U+{ord(ch):04X}, "
                f"character {i + 1} of the name), which would print like another name: remove it; tool "
                "names are letters, digits and _ . : / - only")
    return f"{name!r} is not a valid tool name: use letters, digits and _ . : / - only"


def tool_name_is_well_formed(m: ToolManifest) -> Iterator[Finding]:
    """Tool names, the tool's own and every one it names, are letters, digits and
    _ . : / -, 1 to 128 characters, matched over the whole name."""
    for path, name in [("tool", m.tool), *tool_references(m)]:
        problem = _name_problem(name)
        if problem is not None:
            yield path, problem


def permission_has_no_whitespace(m: ToolManifest) -> Iterator[Finding]:
    if not m.permission or any(ch.isspace() for ch in m.permission):
        yield "permission", (f"{m.permission!r} must be one non-empty word with no whitespace, "
                             "such as payments:write")


def compensation_matches_effect(m: ToolManifest) -> Iterator[Finding]:
    """Reversible and compensable tools declare a compensation; other effects must not."""
    if m.effect in UNDOABLE and m.compensation is None:
        yield "compensation", (f"{_a(m.effect)} tool must declare how it is undone: add "
                               "compensation: {tool, argument_map}")
    if m.effect not in UNDOABLE and m.compensation is not None:
        yield "compensation", (f"{_a(m.effect)} tool has nothing to undo: remove compensation, "
                               "or change effect to reversible or compensable")


def irreversible_needs_approval(m: ToolManifest) -> Iterator[Finding]:
    if m.effect == Effect.irreversible and not m.approval.required:
        yield "approval", ("an irreversible tool cannot set approval: never; remove the field "
                           "(it defaults to always) or set an approval object")


def no_self_reference(m: ToolManifest) -> Iterator[Finding]:
    """A tool cannot require or replace itself, and undoes itself only as its own exact
    inverse called with other arguments (``self_inverse_problem``)."""
    problem = self_inverse_problem(m)
    if problem is not None:
        yield "compensation.tool", problem
    for i, req in enumerate(m.requires):
        if req.tool == m.tool:
            yield f"requires[{i}]", "a tool cannot require itself: remove this entry"
    if m.replaced_by == m.tool:
        yield "replaced_by", "a tool cannot be replaced by itself: name its successor"


def self_inverse_problem(m: ToolManifest) -> str | None:
    """Why the tool may not be its own undo, or None (also when it names another tool).

    A tool may undo itself (a move is undone by moving back) when that is an exact inverse
    (effect reversible, kind inverse) and the undo does not repeat the call: at least one
    undo argument comes from another place than the call's argument of the same name
    (``from: $args.to``, ``to: $args.from``). An undo that sends every argument back
    unchanged would do the same thing again (a toggle, a create)."""
    c = m.compensation
    if c is None or c.tool != m.tool:
        return None
    if m.effect != Effect.reversible or c.kind != "inverse":
        return ("a tool undoes itself only as its own exact inverse (a move undone by moving "
                "back): set effect: reversible and compensation.kind: inverse, or name the "
                "undoing tool")
    for name, raw in c.argument_map.items():
        try:
            ref = parse_ref(raw)
        except RefSyntaxError:
            return None  # references_parse_and_read_allowed_roots says so
        if not (ref.root == "args" and ref.path == (name,)):
            return None
    return ("the undo would call the tool again with the same arguments, which repeats the "
            "effect: a tool that undoes itself must take at least one undo argument from "
            "another place (a move: from: $args.to, to: $args.from)")


def self_inverse_reads_the_prior_state(m: ToolManifest) -> Iterator[Finding]:
    """A tool that is its own inverse puts back a prior state: the undo and its read-back
    take that state from what the system said (``$before``, the capture's read; or
    ``$result``), never from the call's own arguments alone, which are the agent's claim
    (``mail.move`` undone to the folder the agent *said* the message came from, and read
    back as that folder, records ``undone`` whatever happened). An argument passed back
    under its own name (``id: $args.id``) names the thing, and is fine."""
    c = m.compensation
    if c is None or c.tool != m.tool or self_inverse_problem(m) is not None:
        return
    identity: set[str] = set()
    claims: list[str] = []
    told = False
    for name, raw in c.argument_map.items():
        try:
            ref = parse_ref(raw)
        except RefSyntaxError:
            return  # references_parse_and_read_allowed_roots says so
        if ref.root == "args" and ref.path[:1] == (name,):
            identity.add(name)
        elif ref.root == "args":
            claims.append(f"{name}: {raw.strip()}")
        elif ref.root in ("before", "result"):
            told = True
    fix = ("capture the state before the call (capture: {tool: <a read_only tool>, arguments: "
           "{...}}) and read it as $before.<field>, or take it from the call's answer "
           "($result.<field>)")
    if claims and not told:
        yield "compensation.argument_map", (
            f"{m.tool} undoes itself with the call's own arguments only ({', '.join(claims)}): "
            "the prior state it puts back is what the agent claimed, which the upstream may "
            f"never have checked; {fix}")
    v = c.verification
    for path, raw in (v.expect.items() if v is not None else ()):
        try:
            expected = expected_reference(raw)
        except RefSyntaxError:
            continue  # verification_expect_parses says so
        if expected is not None and expected.root == "args" and expected.path \
                and str(expected.path[0]) not in identity:
            yield f"compensation.verification.expect.{path}", (
                f"expects {raw.strip()}, the state the agent claimed before the call: a read-back "
                f"of the claim confirms the claim, not the prior state; {fix}")


def requires_has_no_duplicates(m: ToolManifest) -> Iterator[Finding]:
    seen: set[str] = set()
    for i, req in enumerate(m.requires):
        if req.tool in seen:
            yield f"requires[{i}]", f"{req.tool!r} is listed twice: remove the duplicate"
        seen.add(req.tool)


def _reference_places(m: ToolManifest) -> Iterator[tuple[str, Any, frozenset[str], str]]:
    """Every place that holds a reference, with the roots it may read and why."""
    plain = frozenset({"args", "result", "const"})
    undo = plain | {"before"}  # $before without a capture: before_needs_a_capture says so
    late = undo | {"current"}  # $current without a read: current_needs_a_read says so
    c = m.compensation
    if c:
        for name, ref in c.argument_map.items():
            yield f"compensation.argument_map.{name}", ref, late, "an undo argument"
        for name, ref in (c.headers or {}).items():
            yield f"compensation.headers.{name}", ref, late, "an undo header"
        for i, ref in enumerate(c.object or []):
            yield f"compensation.object[{i}]", ref, undo, "an object key"
        if c.current:
            for name, ref in c.current.arguments.items():
                yield (f"compensation.current.arguments.{name}", ref, undo,
                       "an argument of the read before the undo")
        if c.verification:
            for name, ref in c.verification.arguments.items():
                yield (f"compensation.verification.arguments.{name}", ref, undo,
                       "a verification argument")
        if c.deadline and c.deadline.at is not None:
            yield "compensation.deadline.at", c.deadline.at, frozenset({"result"}), "deadline.at"
    if m.audit:
        for i, ref in enumerate(m.audit.redaction):
            yield (f"audit.redaction[{i}]", ref, frozenset({"args", "result", "before"}),
                   "a redaction path")
    if m.lookup:
        if m.lookup.by == "idempotency_key":
            roots = frozenset({"args", "key", "const"}) if m.idempotency else frozenset({"args", "const"})
            why = ("a lookup by idempotency key" if m.idempotency else
                   "a lookup on a tool without an idempotency declaration")
        else:
            roots, why = frozenset({"args", "result", "const"}), "a lookup by id"
        for name, ref in m.lookup.arguments.items():
            yield f"lookup.arguments.{name}", ref, roots, why
    if m.draft:
        for name, ref in m.draft.arguments.items():
            yield f"draft.arguments.{name}", ref, frozenset({"args", "const"}), "a draft argument"
        for name, ref in m.draft.handle.items():
            yield f"draft.handle.{name}", ref, plain, "a draft handle"
    if m.capture:
        for name, ref in m.capture.arguments.items():
            yield (f"capture.arguments.{name}", ref, frozenset({"args", "const"}),
                   "a capture argument (it runs before the call, which has no answer yet)")


def references_parse_and_read_allowed_roots(m: ToolManifest) -> Iterator[Finding]:
    """Every reference parses and reads only the roots its place allows."""
    for path, raw, roots, why in _reference_places(m):
        try:
            ref = parse_ref(raw)
        except RefSyntaxError as exc:
            yield path, str(exc)
            continue
        if ref.root not in roots:
            allowed = ", ".join(_ROOT_WORDS[r] for r in sorted(roots))
            yield path, (f"{why} cannot read {_ROOT_WORDS[ref.root]}; it may read {allowed}")


def _before_readers(m: ToolManifest) -> Iterator[tuple[str, Any]]:
    """(path, reference) for every place that reads ``$before``."""
    c = m.compensation
    if c is None:
        return
    places: list[tuple[str, Any]] = [(f"compensation.argument_map.{k}", v)
                                     for k, v in c.argument_map.items()]
    if c.verification:
        places += [(f"compensation.verification.arguments.{k}", v)
                   for k, v in c.verification.arguments.items()]
        places += [(f"compensation.verification.expect.{k}", v)
                   for k, v in c.verification.expect.items()]
    for path, raw in places:
        if before_reference(raw) is not None:
            yield path, raw


def before_needs_a_capture(m: ToolManifest) -> Iterator[Finding]:
    """``$before.<path>`` reads what the capture read before the call: without a capture
    there is nothing to read."""
    if m.capture is not None:
        return
    for path, raw in _before_readers(m):
        yield path, (f"reads {raw.strip()}, but the manifest declares no capture: add "
                     "capture: {tool: <a read_only tool>, arguments: {...}} that reads the "
                     "state the call changes")


def current_needs_a_read(m: ToolManifest) -> Iterator[Finding]:
    """``$current.<path>`` reads what ``compensation.current`` read right before the undo:
    without that read there is nothing to read."""
    c = m.compensation
    if c is None or c.current is not None:
        return
    places = [*((f"compensation.argument_map.{k}", v) for k, v in c.argument_map.items()),
              *((f"compensation.headers.{k}", v) for k, v in (c.headers or {}).items())]
    for path, raw in places:
        if isinstance(raw, str) and raw.strip().startswith("$current"):
            yield path, (f"reads {raw.strip()}, but compensation.current is not declared: add "
                         "current: {tool: <a read_only tool>, arguments: {...}} that reads the "
                         "object right before the undo")


def undo_headers_are_http_headers(m: ToolManifest) -> Iterator[Finding]:
    """compensation.headers are HTTP header names the undo call sends."""
    c = m.compensation
    for name in (c.headers or {}) if c else ():
        if not _HEADER_NAME.fullmatch(name):
            yield f"compensation.headers.{name}", ("is not an HTTP header name: letters, digits "
                                                   "and -, up to 64 characters")


def after_call_reads_for_a_capture(m: ToolManifest) -> Iterator[Finding]:
    """verification.after_call keeps what the divergence check compares with: only a tool
    with a capture (whose undo restores old values) has one."""
    v = m.compensation.verification if m.compensation else None
    if v is not None and v.after_call and m.capture is None:
        yield "compensation.verification.after_call", (
            "serves the divergence check of a capture (what the call left, read after it): "
            "without a capture there is none; remove after_call or add a capture")
    if v is not None and v.after_call and v.absent is not None:
        yield "compensation.verification.after_call", (
            "reads the fields the call set (expect); with absent there are none to keep: "
            "remove after_call")


def capture_only_with_an_undo(m: ToolManifest) -> Iterator[Finding]:
    """A capture keeps state for the undo: only a reversible or compensable tool has one."""
    if m.capture is not None and m.effect not in UNDOABLE:
        yield "capture", (f"{_a(m.effect)} tool has no undo to read the captured state: "
                          "remove capture, or declare the tool reversible or compensable")


def inverse_has_no_residue(m: ToolManifest) -> Iterator[Finding]:
    c = m.compensation
    if c and c.kind == "inverse" and c.residue:
        yield "compensation.residue", ("an inverse restores the exact prior state and cannot "
                                       "leave residue: remove residue or set kind: compensation")


def deadline_bounds_an_inverse(m: ToolManifest) -> Iterator[Finding]:
    """A deadline has exactly one form and only bounds an exact inverse of a reversible tool."""
    c = m.compensation
    if not c or not c.deadline:
        return
    forms = [f for f in ("within_ms", "at") if getattr(c.deadline, f) is not None]
    if len(forms) != 1:
        yield "compensation.deadline", ("give exactly one of within_ms or at "
                                        f"(found {len(forms)})")
    if c.kind != "inverse" or m.effect != Effect.reversible:
        yield "compensation.deadline", ("a deadline says until when an exact inverse is "
                                        "possible: use it only on a reversible tool whose "
                                        "compensation has kind: inverse")


def retry_only_when_safe(m: ToolManifest) -> Iterator[Finding]:
    if m.retry is not None and m.effect not in (Effect.read_only, Effect.idempotent):
        yield "retry", (f"retrying {_a(m.effect)} tool could repeat its effect: remove retry, "
                        "or declare the tool idempotent if repeating it is safe")


_EXPECT_ROOTS = frozenset({"args", "result", "before", "const"})


def expect_key_problem(key: str) -> str | None:
    """Why an ``expect`` key is not a path to one value of the read-back's answer, or None."""
    if key.strip().startswith("$"):
        return (f"{key!r}: an expect key is a path in the read-back's answer, written without "
                "a root (status, items[0].id); $result in an expected value means the call's "
                "answer, not the read-back's")
    try:
        ref = answer_path(key)
    except RefSyntaxError as exc:
        return f"{key!r} is not a path in the read-back's answer: {exc}"
    if ref.optional:
        return f"{key!r}: an expected path is never optional: remove the ?"
    if EACH in ref.path:
        return (f"{key!r}: an expect key names one value, so it has no [*]: expect the whole "
                "list at its path (items: $args.ids), or one item (items[0].id)")
    return None


def verification_expect_parses(m: ToolManifest) -> Iterator[Finding]:
    """Every ``expect`` key is a path to one value of the read-back's answer, and every
    expected value written as a reference (a text starting with ``$``, or ``{const: v}``)
    parses and reads the call (``$args``, ``$result``), the captured state (``$before``)
    or a literal, never optionally; any other value is a literal."""
    v = m.compensation.verification if m.compensation else None
    for key, raw in (v.expect.items() if v is not None else ()):
        where = f"compensation.verification.expect.{key}"
        problem = expect_key_problem(key)
        if problem is not None:
            yield where, problem
        try:
            ref = expected_reference(raw)
        except RefSyntaxError as exc:
            yield where, (f"{exc}; to expect this text as written, write "
                          f"{{const: {raw.strip()!r}}}" if isinstance(raw, str) else str(exc))
            continue
        if ref is None:
            continue
        if ref.root not in _EXPECT_ROOTS:
            allowed = ", ".join(_ROOT_WORDS[r] for r in sorted(_EXPECT_ROOTS))
            yield where, f"an expected value cannot read {_ROOT_WORDS[ref.root]}; it may read {allowed}"
        elif ref.optional:
            yield where, (f"{ref.text()}: an expected value is never optional (a read-back "
                          "whose expectation is unknown proves nothing): remove the ?")


def one_value_where_one_is_needed(m: ToolManifest) -> Iterator[Finding]:
    """``[*]`` builds a list: not where one value is needed (``deadline.at``, one time)."""
    c = m.compensation
    if c and c.deadline and c.deadline.at is not None:
        try:
            ref = parse_ref(c.deadline.at)
        except RefSyntaxError:
            return  # references_parse_and_read_allowed_roots says so
        if ref.projects:
            yield "compensation.deadline.at", (f"{ref.text()} is a list ([*]); the deadline is "
                                               "one time: name one value ($result.expires_at)")


def verification_expects_something(m: ToolManifest) -> Iterator[Finding]:
    """A read-back checks values (expect) or that the thing is gone (absent): one of them."""
    v = m.compensation.verification if m.compensation else None
    if v is None:
        return
    if v.absent is not None and v.expect:
        yield "compensation.verification.expect", ("and absent cannot both be given: absent "
                                                   "proves the thing is gone, so there are no "
                                                   "values to expect; remove one")
    elif v.absent is None and not v.expect:
        yield "compensation.verification.expect", ("is empty: add at least one "
                                                   "path: expected value, or absent: true "
                                                   "when the undo removes the thing")


def _client_error_statuses(path: str, statuses: list[int]) -> Iterator[Finding]:
    for i, status in enumerate(statuses):
        if not 400 <= status <= 499:
            yield f"{path}[{i}]", (f"{status} is not a status from 400 to 499: only a client "
                                   "error can mean 'not there' (a 2xx is read as an answer, "
                                   "a 5xx is a failure)")


def absence_is_declared_clearly(m: ToolManifest) -> Iterator[Finding]:
    """absent's statuses are client errors, its shape names at least one path that parses;
    done_statuses are client errors and need a read-back to confirm them."""
    c = m.compensation
    if c is None:
        return
    v = c.verification
    if v is not None and v.absent is not None:
        a = v.absent
        if not a.statuses and a.shape is None:
            yield "compensation.verification.absent.statuses", (
                "is empty and there is no shape: nothing but an empty list would mean gone; "
                "list statuses such as [404, 410] or give a shape")
        yield from _client_error_statuses("compensation.verification.absent.statuses",
                                          a.statuses)
        if a.shape is not None and not a.shape:
            yield "compensation.verification.absent.shape", (
                "is empty, so every answer would mean gone: add at least one path: value "
                "(e.g. found: false) or remove shape")
        for key in (a.shape or {}):
            try:
                answer_path(key)
            except RefSyntaxError as exc:
                yield f"compensation.verification.absent.shape.{key}", str(exc)
    if c.done_statuses is not None:
        if v is None:
            yield "compensation.done_statuses", (
                "needs compensation.verification: a status such as 404 counts as done only "
                "when a read-back confirms the thing is gone (a wrong URL answers 404 too)")
        yield from _client_error_statuses("compensation.done_statuses", c.done_statuses)


def approval_rules_are_consistent(m: ToolManifest) -> Iterator[Finding]:
    a = m.approval
    if not 1 <= a.quorum <= 10:
        yield "approval.quorum", f"must be between 1 and 10 (got {a.quorum})"
    elif a.quorum > 1 and not a.roles:
        yield "approval.quorum", (f"a quorum of {a.quorum} needs roles: list the groups "
                                  "whose members may approve")
    if a.on_timeout == "escalate" and not a.escalate_to:
        yield "approval.escalate_to", "on_timeout: escalate needs escalate_to: list the groups"


def idempotency_key_uses_arguments(m: ToolManifest) -> Iterator[Finding]:
    if m.idempotency is None:
        return
    names = _PLACEHOLDER.findall(m.idempotency.key)
    for name in names:
        if "[*]" in name:
            yield "idempotency.key", (f"placeholder {{{{{name}}}}} projects a list ([*]), but a "
                                      "key is one plain value: key on one argument that "
                                      "identifies the call ({{args.<field>}})")
        elif not _ARGS_PLACEHOLDER.fullmatch(name):
            yield "idempotency.key", (f"placeholder {{{{{name}}}}} is not a call argument: "
                                      "write {{args.<field>}}")
    if not any(_ARGS_PLACEHOLDER.fullmatch(n) for n in names):
        yield "idempotency.key", ("the key template needs at least one {{args.<field>}} so "
                                  "different calls get different keys")


def idempotency_carrier_names_one_place(m: ToolManifest) -> Iterator[Finding]:
    """A carrier is exactly one header (an HTTP token) or one argument (a plain name)."""
    carrier = m.idempotency.carrier if m.idempotency else None
    if carrier is None:
        return
    if (carrier.header is None) == (carrier.argument is None):
        yield "idempotency.carrier", "give exactly one of header or argument"
    elif carrier.header is not None and not _HEADER_NAME.fullmatch(carrier.header):
        yield "idempotency.carrier.header", (f"{carrier.header!r} is not an HTTP header name: "
                                             "use letters, digits and '-'")
    elif carrier.argument is not None and not _ARGUMENT_NAME.fullmatch(carrier.argument):
        yield "idempotency.carrier.argument", (f"{carrier.argument!r} is not an argument name: "
                                               "use letters, digits, '_' and '-'")


def idempotency_key_reads_no_redacted_value(m: ToolManifest) -> Iterator[Finding]:
    """The rendered key is stored in clear (the entry's ``key``, its report, a lookup by
    key, the lock's holder), so a key template must not read what ``audit.redaction``
    keeps out of the ledger."""
    if m.idempotency is None or m.audit is None or not m.audit.redaction:
        return
    redacted = redaction_references(m)
    for name in _PLACEHOLDER.findall(m.idempotency.key):
        if not _ARGS_PLACEHOLDER.fullmatch(name):
            continue  # idempotency_key_uses_arguments says so
        try:
            ref = parse_ref("$" + name)
        except RefSyntaxError:
            continue
        hit = next((r for r in redacted if overlaps(ref, r)), None)
        if hit is not None:
            yield "idempotency.key", (
                f"placeholder {{{{{name}}}}} reads {hit.text()}, which audit.redaction keeps "
                "out of the ledger, but the rendered key is stored in clear (the entry's key, "
                "its report, the lookup's arguments): key on a non-secret argument that "
                "identifies the call (an order id), or drop the redaction")


def lookup_by_key_needs_idempotency(m: ToolManifest) -> Iterator[Finding]:
    if m.lookup and m.lookup.by == "idempotency_key" and m.idempotency is None:
        yield "lookup.by", ("a lookup by idempotency_key needs an idempotency declaration: add "
                            "idempotency: {key: ...} or look up by id")


def replaced_by_only_when_deprecated(m: ToolManifest) -> Iterator[Finding]:
    if m.replaced_by and m.lifecycle != "deprecated":
        yield "replaced_by", ("only a deprecated tool names a replacement: set lifecycle: "
                              "deprecated or remove replaced_by")


def upstream_has_one_target(m: ToolManifest) -> Iterator[Finding]:
    u = m.upstream
    if u is None:
        return
    if (u.url is None) == (u.mcp is None):
        yield "upstream", "give exactly one of url or mcp"
    if u.url is not None and not u.url.startswith(("http://", "https://")):
        yield "upstream.url", f"{u.url!r} must be an http:// or https:// URL"


def mcp_server_is_a_url_or_a_command(m: ToolManifest) -> Iterator[Finding]:
    """An MCP upstream is reached at a URL or started from a command (local mode only:
    the admission webhook refuses a command in a cluster)."""
    mcp = m.upstream.mcp if m.upstream is not None else None
    if mcp is None:
        return
    if (mcp.url is None) == (mcp.command is None):
        yield "upstream.mcp", ("give exactly one of url (a streamable HTTP server) or command "
                               "(a stdio server the gateway starts, local mode only)")
    if mcp.url is not None and not mcp.url.startswith(("http://", "https://")):
        yield "upstream.mcp.url", f"{mcp.url!r} must be an http:// or https:// URL"
    if mcp.command is not None and not mcp.command[0].strip():
        yield "upstream.mcp.command", "the first item is the program to run: it cannot be empty"
    if mcp.command is None and (mcp.env or mcp.cwd is not None):
        yield "upstream.mcp", "env and cwd go with command: remove them or give a command"


_SINGLE_BRACE = re.compile(r"(?<!\{)\{\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*\}(?!\})")
_URL_MARK = "\x00"


def _split_template(url: str) -> tuple[str, str, str]:
    """(scheme://, authority, rest) of a URL template, its ``{{...}}`` placeholders kept in
    the part where they stand (a placeholder is masked while the parts are found, so a '/'
    or '?' inside one does not end the authority)."""
    masked = _PLACEHOLDER.sub(lambda m: _URL_MARK * len(m.group(0)), url)
    start = masked.find("://") + 3 if "://" in masked else 0
    end = next((i for i in range(start, len(masked)) if masked[i] in "/?#"), len(masked))
    return url[:start], url[start:end], url[end:]


def upstream_url_host_is_fixed(m: ToolManifest) -> Iterator[Finding]:
    """A placeholder may fill only the path and the query's values, never the scheme, host
    or port: an agent's argument would otherwise choose the server that receives the call
    and the credentials the manifest's headers attach to it."""
    url = m.upstream.url if m.upstream else None
    if url is None or not url.startswith(("http://", "https://")):
        return  # upstream_has_one_target says so
    scheme, authority, _ = _split_template(url)
    found = _PLACEHOLDER.search(scheme + authority)
    if found is not None:
        yield "upstream.url", (
            f"the placeholder {found.group(0)} stands before the path (in the scheme, host or "
            "port): a call's arguments would choose the server that receives the call and the "
            "tool's credentials; write the host in the manifest, and use placeholders only for "
            "path segments and query values (https://api.example.com/items/{{args.id}})")


def upstream_url_placeholders_have_two_braces(m: ToolManifest) -> Iterator[Finding]:
    """``{id}`` (the OpenAPI form) is not a placeholder: the gateway would send the braces
    as written, to a path that does not exist."""
    url = m.upstream.url if m.upstream else None
    if url is None:
        return
    masked = _PLACEHOLDER.sub(lambda x: _URL_MARK * len(x.group(0)), url)
    for match in _SINGLE_BRACE.finditer(masked):
        name = match.group(1)
        arg = name.removeprefix("args.")
        yield "upstream.url", (f"{match.group(0)} is not a placeholder (the gateway would send "
                               f"the braces as written): write {{{{args.{arg}}}}}")


def input_schema_is_bounded_json_schema(m: ToolManifest) -> Iterator[Finding]:
    """``input_schema`` is a JSON Schema 2020-12 object schema the gateway can evaluate on
    every call: bounded in size and depth, references inside itself only."""
    if m.input_schema is not None:
        yield from schema_problems(m.input_schema)


MANIFEST_RULES: tuple[Rule, ...] = (
    tool_name_is_well_formed,
    permission_has_no_whitespace,
    compensation_matches_effect,
    irreversible_needs_approval,
    no_self_reference,
    self_inverse_reads_the_prior_state,
    requires_has_no_duplicates,
    references_parse_and_read_allowed_roots,
    before_needs_a_capture,
    current_needs_a_read,
    undo_headers_are_http_headers,
    after_call_reads_for_a_capture,
    capture_only_with_an_undo,
    inverse_has_no_residue,
    deadline_bounds_an_inverse,
    retry_only_when_safe,
    verification_expects_something,
    verification_expect_parses,
    one_value_where_one_is_needed,
    absence_is_declared_clearly,
    approval_rules_are_consistent,
    idempotency_key_uses_arguments,
    idempotency_carrier_names_one_place,
    idempotency_key_reads_no_redacted_value,
    lookup_by_key_needs_idempotency,
    replaced_by_only_when_deprecated,
    upstream_has_one_target,
    mcp_server_is_a_url_or_a_command,
    upstream_url_host_is_fixed,
    upstream_url_placeholders_have_two_braces,
    input_schema_is_bounded_json_schema,
)


def validate_manifest(data: Any) -> tuple[ToolManifest | None, list[Issue]]:
    """Parse and check one manifest. Returns the normalized model (None when it does not
    parse) and every issue found."""
    tool = data.get("tool") if isinstance(data, dict) else None
    tool = tool if isinstance(tool, str) else None
    if not isinstance(data, dict):
        return None, [Issue(tool, "", f"a manifest must be a mapping, got {type(data).__name__}")]
    try:
        manifest = ToolManifest.model_validate(data)
    except ValidationError as exc:
        return None, issues_from_validation_error(exc, data, tool, ToolManifest) + _rules_despite(exc, data)
    issues = [Issue(manifest.tool, path, msg) for rule in MANIFEST_RULES for path, msg in rule(manifest)]
    return manifest, issues


def _rules_despite(error: ValidationError, data: dict[str, Any]) -> list[Issue]:
    """The rule errors that field errors would hide: check the manifest again without the
    fields that failed, and keep the findings that do not touch those fields. Every error
    of a manifest then shows in one run, not in rounds."""
    failed = {input_path(data, tuple(e["loc"])) for e in error.errors(include_url=False)}
    pruned = without_paths(data, failed)
    try:
        manifest = ToolManifest.model_validate(pruned)
    except ValidationError:
        return []  # a required field failed: nothing sound is left to check the rules on
    removed = [format_path(p) for p in failed]

    def touches(path: str) -> bool:
        return any(path == r or path.startswith((r + ".", r + "[")) or r.startswith((path + ".", path + "["))
                   for r in removed)
    return [Issue(manifest.tool, path, msg) for rule in MANIFEST_RULES for path, msg in rule(manifest)
            if not touches(path)]


# ---- set level -------------------------------------------------------------------------

def tool_references(m: ToolManifest) -> Iterator[tuple[str, str]]:
    """(field path, tool name) for every place a manifest names another tool."""
    for place in READER_PLACES:
        yield from names_at(m, place.field)


SetRule = Callable[[Sequence[ToolManifest], dict[str, ToolManifest]], Iterator[Issue]]


def no_duplicate_tools(ms: Sequence[ToolManifest], _: dict[str, ToolManifest]) -> Iterator[Issue]:
    seen: set[str] = set()
    for i, m in enumerate(ms):
        if m.tool in seen:
            yield Issue(m.tool, "tool", f"{m.tool!r} is declared more than once: keep one manifest "
                        "per tool", index=i)
        seen.add(m.tool)


def referenced_tools_exist(ms: Sequence[ToolManifest], by: dict[str, ToolManifest]) -> Iterator[Issue]:
    for i, m in enumerate(ms):
        for path, name in tool_references(m):
            if name not in by and name != m.tool:
                close = difflib.get_close_matches(name, [t for t in by if t != m.tool], n=1, cutoff=0.8)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                yield Issue(m.tool, path, f"names {name!r}, which has no manifest{hint}: add one "
                            "or fix the name", index=i, ref=name)


def read_backs_are_read_only(ms: Sequence[ToolManifest], by: dict[str, ToolManifest]) -> Iterator[Issue]:
    """Verification, lookup and capture tools only read: a read-back must not change
    anything."""
    for i, m in enumerate(ms):
        targets = []
        if m.compensation and m.compensation.verification:
            targets.append(("compensation.verification.tool", m.compensation.verification.tool))
        if m.lookup:
            targets.append(("lookup.tool", m.lookup.tool))
        if m.capture:
            targets.append(("capture.tool", m.capture.tool))
        if m.compensation and m.compensation.current:
            targets.append(("compensation.current.tool", m.compensation.current.tool))
        for path, name in targets:
            other = by.get(name)
            if other is not None and other.effect != Effect.read_only:
                yield Issue(m.tool, path, f"{name!r} is {other.effect}; a read-back tool must be "
                            "read_only", index=i)


def find_requires_cycles(ms: Iterable[ToolManifest]) -> list[list[str]]:
    """Each cycle in the requires graph, as the list of tools around it. Iterative, so a
    chain of thousands of requirements cannot exhaust the interpreter's stack."""
    graph = {m.tool: [r.tool for r in m.requires] for m in ms}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}  # 1 = on the path, 2 = done
    for root in sorted(graph):
        if root in state:
            continue
        path: list[str] = [root]
        todo: list[Iterator[str]] = [iter(graph[root])]
        state[root] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                cycles.append(_from_smallest(path[path.index(nxt):]))
            elif nxt in graph and nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(graph[nxt]))
    return cycles


def _from_smallest(loop: list[str]) -> list[str]:
    """A cycle written from its smallest name and closed (a -> b -> a), so the same cycle
    reads the same whichever tool the search reached it from."""
    start = loop.index(min(loop))
    turned = loop[start:] + loop[:start]
    return [*turned, turned[0]]


def requires_has_no_cycle(ms: Sequence[ToolManifest], _: dict[str, ToolManifest]) -> Iterator[Issue]:
    for cycle in find_requires_cycles(ms):
        if len(cycle) > 2:  # a self-requirement is reported by no_self_reference
            shown = cycle if len(cycle) <= 12 else [*cycle[:5], "...", *cycle[-5:]]
            yield Issue(cycle[0], "requires", "requires forms a cycle: " + " -> ".join(shown)
                        + "; break it by removing one of these requirements")


def mcp_names_are_distinct(ms: Sequence[ToolManifest], _: dict[str, ToolManifest]) -> Iterator[Issue]:
    """Over MCP a tool is served under a model-API name (``.``, ``:``, ``/`` become ``__``,
    mcp_names.py): two tools of a set may not share one (``a.b`` and ``a__b``)."""
    first: dict[str, str] = {}
    for i, m in enumerate(ms):
        name = mcp_name(m.tool)
        other = first.setdefault(name, m.tool)
        if other != m.tool:
            yield Issue(m.tool, "tool", f"{m.tool!r} and {other!r} would both be served over MCP "
                        f"as {name!r} (dots, colons and slashes become __): rename one", index=i)


SET_RULES: tuple[SetRule, ...] = (
    no_duplicate_tools,
    mcp_names_are_distinct,
    referenced_tools_exist,
    read_backs_are_read_only,
    requires_has_no_cycle,
)


def validate_set(manifests: Sequence[ToolManifest]) -> list[Issue]:
    """Cross-manifest checks over one namespace, or over the files given to the CLI."""
    by_name = {m.tool: m for m in manifests}
    return [issue for rule in SET_RULES for issue in rule(manifests, by_name)]


def validate_namespace(manifests: Sequence[ToolManifest]) -> list[Issue]:
    """The set-level check of one namespace, judged the way the cluster enforces it.

    Only non-draft manifests are ever enforced, so they must form a valid set on their own
    (``validate_set`` over them): an approved tool that names a tool with only a draft
    version would lean on something the gateway refuses, and that missing reference says
    "names X, which has no approved version: approve it first". A draft is checked against
    everything (the enforced set plus the other drafts), so its author sees what it would
    break once approved. A tool declared twice is an error whatever the lifecycles.

    Each issue's ``index`` is the position in ``manifests`` of the manifest it is about.
    Everything that checks a namespace (``unwind validate`` offline, the operator's
    reconcile) must call this function, so an offline check and the cluster cannot
    disagree; a rule about lifecycles across tools belongs here, not in a caller.
    """
    enforced = [i for i, m in enumerate(manifests) if m.lifecycle != Lifecycle.draft]
    only_drafts = {m.tool for m in manifests} - {manifests[i].tool for i in enforced}
    issues: list[Issue] = []
    for issue in validate_set([manifests[i] for i in enforced]):
        index = enforced[issue.index] if issue.index is not None else None
        issues.append(replace(_explain_draft(issue, only_drafts), index=index))
    seen = {_issue_key(i) for i in issues}
    for issue in validate_set(manifests):  # drafts, and what only drafts add (duplicates, cycles)
        if _issue_key(issue) not in seen:
            seen.add(_issue_key(issue))
            issues.append(issue)
    return issues


def _explain_draft(issue: Issue, only_drafts: set[str]) -> Issue:
    """A missing reference to a tool that exists only as a draft says so, and what to do."""
    if issue.ref is not None and issue.ref in only_drafts:
        return replace(issue, message=f"names {issue.ref!r}, which has no approved version: "
                       "approve it first")
    return issue


def _issue_key(issue: Issue) -> tuple[int | None, str | None, str, str]:
    return (issue.index, issue.tool, issue.path, issue.message)
