"""The tool manifest model (pydantic v2).

One manifest declares one tool an agent may call: what the call changes, the permission
it needs, who approves it, and how to undo it and read the undo back. The model does the
structural work (types, unknown fields, defaults, durations, the approval shapes); the
rules that relate fields to each other live in ``validate.py`` as small named checks, so
each can be tested and reported on its own.

Field descriptions here are what ``kubectl explain toolmanifest.spec...`` shows, because
the CRD schema is generated from this model.
"""

from __future__ import annotations

import shlex
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from .durations import parse_manifest_duration

# The one tool-name pattern. In Python, check it with ``re.fullmatch`` (``$`` alone would
# also match before a trailing newline). It is written for the schemas too: JSON Schema
# (ECMA-262) and Kubernetes (Go RE2) both read ``$`` without a multiline flag as the end of
# the input, and neither has Python's ``\Z``.
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_.:/-]{1,128}$"
# A field that names a tool: the pattern goes into the JSON Schema and the CRD (the API
# server refuses a bad name before anything else sees it); the validator checks it with
# a message that says what is wrong (validate.tool_names_are_well_formed).
ToolName = Annotated[str, WithJsonSchema({"type": "string", "pattern": TOOL_NAME_PATTERN})]


def _duration(value: Any) -> Any:
    return None if value is None else parse_manifest_duration(value)


_DURATION_SCHEMA = WithJsonSchema({
    "anyOf": [{"type": "integer", "minimum": 0},
              {"type": "string", "pattern": r"^\s*\d+\s*(ms|s|m|h|d)?\s*$"}],
    "description": "Milliseconds, or a string with a unit: 500ms, 30s, 15m, 2h, 1d.",
})
Duration = Annotated[int, BeforeValidator(_duration), _DURATION_SCHEMA]
OptDuration = Annotated[int | None, BeforeValidator(_duration), _DURATION_SCHEMA]
# A reference is kept as written ($args.x, $result.y?, $key, {const: v}); validate.py parses
# each one and reports the field path of any that does not parse.
Reference = Annotated[
    Any,
    WithJsonSchema({
        "anyOf": [{"type": "string", "pattern": r"^\$(args|result|key|before|current)"},
                  {"type": "object", "properties": {"const": {}}, "required": ["const"],
                   "additionalProperties": False}],
        "description": "A reference: $args.<path>, $result.<path>, $before.<path>, $key, or "
                       "{const: <value>}. "
                       "A trailing ? makes it optional.",
    }),
]


class Effect(StrEnum):
    read_only = "read_only"
    idempotent = "idempotent"
    reversible = "reversible"
    compensable = "compensable"
    irreversible = "irreversible"


MUTATING = {Effect.reversible, Effect.compensable, Effect.irreversible, Effect.idempotent}
UNDOABLE = {Effect.reversible, Effect.compensable}


class Lifecycle(StrEnum):
    draft = "draft"
    approved = "approved"
    deprecated = "deprecated"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_enum_values=True)


class Approval(Strict):
    """Who must approve each call. The string forms normalize here: never → required false,
    always → required true."""

    required: bool = Field(True, description="Whether a human approves each call.")
    roles: list[str] = Field(default_factory=list, description="Kubernetes groups allowed to approve.")
    quorum: int = Field(1, description="Distinct approvers needed, 1 to 10; above 1 needs roles.")
    timeout: OptDuration = Field(None, description="How long to wait for approval.")
    on_timeout: Literal["deny", "escalate"] = Field("deny", description="deny (default) or escalate.")
    escalate_to: list[str] = Field(default_factory=list, description="Groups asked after a timeout.")


def _approval(value: Any) -> Any:
    if value == "never":
        return {"required": False}
    if value == "always":
        return {"required": True}
    if isinstance(value, str):
        raise ValueError(f"{value!r} is not an approval: write never, always, or an object")
    return value


class Absent(Strict):
    """When the read-back proves the thing is gone: one of these statuses, a 2xx answer that
    is an empty list, or a 2xx answer matching ``shape``."""

    statuses: list[int] = Field(default_factory=lambda: [404, 410], description="Answer statuses (400 to 499) that mean gone; default [404, 410].")
    shape: dict[str, Any] | None = Field(None, description="Dotted path in a 2xx answer → value (deep equal): an answer matching every entry means gone, e.g. {found: false}.")


def _absent(value: Any) -> Any:
    if value is True:
        return {}
    if value is False:
        raise ValueError("absent: false says nothing: leave absent out and write expect")
    return value


class Verification(Strict):
    """A read-only call made after the undo; the undo only counts when its answer matches
    ``expect``, or, with ``absent``, when the answer says the thing is gone."""

    tool: ToolName = Field(description="A registered read_only tool.")
    arguments: dict[str, Reference] = Field(default_factory=dict, description="References resolved from the original call and result.")
    expect: dict[str, Any] = Field(default_factory=dict, description="Dotted path in the answer → expected value (deep equal). At least one entry, unless absent is given.")
    absent: Annotated[
        Absent | None,
        BeforeValidator(_absent),
        WithJsonSchema({"anyOf": [{"type": "boolean", "enum": [True]}, Absent.model_json_schema()]}),
    ] = Field(None, description="The undo removes the thing: true (a 404 or 410 answer, or an empty list), or {statuses, shape}. Instead of expect.")
    retries: int = Field(3, ge=1, le=10, description="Attempts, 1 to 10.")
    backoff_ms: Duration = Field(1000, description="Wait before the second attempt; doubled after each.")
    after_call: bool | None = Field(
        None, description="With a capture: the gateway makes this read right after the call "
                          "succeeds and keeps its answer at the expect paths in the entry; before "
                          "restoring, the undo compares the state it reads with that read (like "
                          "with like), not with the call's answer.")


class Capture(Strict):
    """A read-only call the gateway makes before the effect, to keep the state the call
    changes: the undo reads it as $before.<path>."""

    tool: ToolName = Field(description="A registered read_only tool that reads the state the call changes.")
    arguments: dict[str, Reference] = Field(default_factory=dict, description="References to the call's arguments ($args) or literals.")


class CurrentRead(Strict):
    """A read-only call made right before the undo: its answer is $current.<path> for the
    undo's arguments and headers (the current revision or ETag, say)."""

    tool: ToolName = Field(description="A registered read_only tool that reads the object as it is now.")
    arguments: dict[str, Reference] = Field(default_factory=dict, description="References resolved from the call ($args, $result, $before) or literals.")


class Deadline(Strict):
    """When the inverse stops being possible; after it, the compensation is used."""

    within_ms: OptDuration = Field(None, description="Time from the call's answer.")
    at: str | None = Field(None, description="A $result path to an ISO-8601 time or epoch milliseconds.")


class Compensation(Strict):
    """How the effect is undone."""

    tool: ToolName = Field(description="The tool that undoes this one; not the tool itself.")
    argument_map: dict[str, Reference] = Field(default_factory=dict, description="The undo call's arguments, as references.")
    kind: Literal["compensation", "inverse"] = Field("compensation", description="inverse restores the exact prior state; compensation makes amends and may leave residue.")
    residue: list[str] = Field(default_factory=list, description="What the undo cannot take back, in plain words.")
    requires_approval: bool = Field(False, description="A human must approve running this compensation.")
    timeout_ms: OptDuration = Field(None, description="Recorded on the undo step for whoever runs it.")
    verification: Verification | None = Field(None, description="Read-back that proves the undo worked.")
    done_statuses: list[int] | None = Field(None, description="Statuses (400 to 499) of the undo call that count as done when the read-back then confirms, e.g. [404] for a DELETE of something already gone. Needs verification.")
    deadline: Deadline | None = Field(None, description="Until when the inverse applies.")
    current: CurrentRead | None = Field(None, description="Read the object right before the undo runs; the undo's arguments and headers read the answer as $current.<path>.")
    headers: dict[str, Reference] | None = Field(None, description="HTTP headers of the undo call, as references (e.g. If-Match: $current._rev): a precondition the API checks, so a record changed since is refused, not overwritten.")
    object: list[Reference] | None = Field(None, description="The values that name the object the call touches (e.g. [$result.id] for a create, [$args.id] for an update): undos of entries on one object run newest first, one at a time. Default: the values the verification (else the undo) names.")


class RequiredTool(Strict):
    tool: ToolName = Field(description="A tool that must have succeeded earlier in the run.")
    status: Literal["succeeded"] = "succeeded"


def _requirement(value: Any) -> Any:
    return {"tool": value} if isinstance(value, str) else value


class Risk(Strict):
    data_class: str | None = Field(None, description="Free text such as pii or financial.")
    blast_radius: Literal["low", "medium", "high", "critical"] | None = None
    environment: str | None = Field(None, description="Recorded only.")


class Retry(Strict):
    attempts: int = Field(3, ge=1, le=10)
    base_ms: Duration = 200
    max_ms: Duration = 5000


class Carrier(Strict):
    """Where the gateway puts the idempotency key in the upstream call: one of the two."""

    header: str | None = Field(None, description="An HTTP header of the upstream request, e.g. Idempotency-Key.")
    argument: str | None = Field(None, description="A call argument (body or query) the upstream reads the key from.")


class Idempotency(Strict):
    key: str = Field(description="Template over call arguments with at least one {{args.field}}.")
    scope: Literal["run", "actor", "global"] = "run"
    carrier: Carrier | None = Field(None, description="Where the rendered key is sent upstream; without it, nothing is sent.")


class Audit(Strict):
    retention_days: int | None = Field(None, ge=1)
    evidence_export: Literal["required", "optional"] | None = None
    redaction: list[Reference] = Field(default_factory=list, description="References to values kept out of the ledger.")


class SecretKeyRef(Strict):
    name: str
    key: str


class HeaderValue(Strict):
    secretKeyRef: SecretKeyRef


class McpUpstream(Strict):
    """An MCP server's tool: a streamable HTTP url, or a stdio command (local mode only)."""

    url: str | None = Field(None, description="The MCP server's streamable HTTP endpoint.")
    command: list[str] | None = Field(
        None, min_length=1,
        description="Local mode only (unwind gateway --manifests): the argv of a stdio MCP "
                    "server the gateway starts, e.g. [npx, -y, '@modelcontextprotocol/server-memory']. "
                    "Refused in a cluster.")
    env: dict[str, str] = Field(default_factory=dict, description="With command: environment variables added for the server.")
    cwd: str | None = Field(None, description="With command: the server's working directory.")
    tool: str

    @property
    def target(self) -> str:
        """The server as messages and schema keys name it: its URL, or its command."""
        if self.url is not None:
            return self.url
        return "command " + shlex.join(self.command or [])


class Upstream(Strict):
    """How the gateway reaches the tool: a JSON HTTP endpoint, or a tool of an MCP server."""

    url: str | None = Field(None, description="The call's arguments are POSTed here as JSON.")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "POST"
    headers: dict[str, str | HeaderValue] = Field(default_factory=dict, description="Literal values or {secretKeyRef: {name, key}}.")
    timeout_ms: OptDuration = None
    mcp: McpUpstream | None = None
    send_placeholder_args: bool | None = Field(None, description="Send an argument that fills a URL placeholder in the body or query too (default: only in the URL).")
    redirects: Literal["same_origin"] | None = Field(
        None, description="Follow the upstream's redirects within its own scheme, host and port "
                          "(at most 5). Unset: a 3xx is the upstream's answer and is not followed. "
                          "A redirect to another origin is never followed: it would carry the "
                          "tool's headers (secrets) and the call's body there.")
    max_response_bytes: int | None = Field(
        None, ge=1024, le=16 * 1024 * 1024,
        description="How many bytes of the upstream's answer (after decompression) the gateway "
                    "reads, 1024 to 16777216 (16 MiB); default 4194304 (4 MiB). A larger answer is not "
                    "read: 502, and the call is uncertain unless the tool is read_only.")


class Lookup(Strict):
    """A read-only call that finds the effect when the call's answer was lost."""

    tool: ToolName
    by: Literal["idempotency_key", "id"]
    arguments: dict[str, Reference] = Field(default_factory=dict)


class Draft(Strict):
    """The staged form of the call, and the calls that publish or discard the draft."""

    tool: ToolName = Field(description="The tool that creates the draft (may be this tool).")
    arguments: dict[str, Reference] = Field(default_factory=dict, description="Read only $args.")
    handle: dict[str, Reference] = Field(default_factory=dict, description="Identifies the draft, from the draft call's $result.")
    promote: ToolName = Field(description="Tool that turns the draft into the real effect.")
    discard: ToolName | None = Field(None, description="Tool that throws the draft away.")


class ToolManifest(Strict):
    """One tool an agent may call: its effect, permission, approval and undo."""

    tool: ToolName = Field(description="Tool name: letters, digits and _ . : / -, up to 128 characters.")
    effect: Effect = Field(description="read_only, idempotent, reversible, compensable or irreversible.")
    permission: str = Field(description="Permission the caller's scope must contain. No whitespace.")
    description: str | None = None
    approval: Annotated[
        Approval,
        BeforeValidator(_approval),
        WithJsonSchema({"anyOf": [{"type": "string", "enum": ["never", "always"]},
                                  Approval.model_json_schema()]}),
    ] = Field(
        default_factory=lambda: Approval(required=False),
        description="never (default), always, or {roles, quorum, timeout, on_timeout, escalate_to}.",
    )
    compensation: Compensation | None = Field(None, description="Required for reversible and compensable tools; forbidden otherwise.")
    requires: list[Annotated[
        RequiredTool,
        BeforeValidator(_requirement),
        WithJsonSchema({"anyOf": [{"type": "string", "pattern": TOOL_NAME_PATTERN},
                                  RequiredTool.model_json_schema()]}),
    ]] = Field(
        default_factory=list, description="Tools that must have succeeded earlier in the run (a name or {tool, status})."
    )
    version: int = Field(1, ge=1, description="Positive integer; registries increment it on every publish.")
    lifecycle: Lifecycle = Field(Lifecycle.approved, description="draft, approved (default) or deprecated.")
    replaced_by: ToolName | None = Field(None, description="For a deprecated tool, the tool to use instead.")
    owner: Annotated[
        list[str],
        WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
    ] = Field(default_factory=list, description="Who to ask when it misbehaves: a name or a list.")
    oncall: str | None = None
    risk: Risk | None = None
    timeout_ms: OptDuration = Field(None, description="Longest the gateway waits for the upstream.")
    retry: Retry | None = Field(None, description="Only for read_only and idempotent tools.")
    idempotency: Idempotency | None = None
    audit: Audit | None = None
    schema_hash: str | None = Field(None, description="Hash of the upstream tool's input schema when the manifest was written.")
    input_schema: dict[str, Any] | None = Field(None, description="JSON Schema (2020-12) of the call's arguments, an object schema: served as the tool's inputSchema over MCP and checked at both doors before anything is recorded. MCP upstreams bring their own; this one, when given, wins.")
    upstream: Upstream | None = None
    lookup: Lookup | None = None
    draft: Draft | None = None
    capture: Capture | None = Field(None, description="Read the state the call changes before it runs; the undo reads it as $before.<path>.")

    @model_validator(mode="before")
    @classmethod
    def _irreversible_needs_approval(cls, data: Any) -> Any:
        # An irreversible call always needs a human; an explicit `never` is left for the
        # validator to refuse with a message, rather than silently overridden here.
        if isinstance(data, dict) and data.get("effect") == "irreversible" and "approval" not in data:
            return {**data, "approval": "always"}
        return data

    @field_validator("owner", mode="before")
    @classmethod
    def _owner_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    def canonical_dict(self) -> dict[str, Any]:
        """The normalized manifest: defaults filled, durations in ms, unset optionals left out
        (so a field added to the model later does not change existing checksums)."""
        return self.model_dump(mode="json", exclude_none=True)

    @property
    def enforceable(self) -> bool:
        return self.lifecycle != Lifecycle.draft
