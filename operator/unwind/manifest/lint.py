"""Lint: manifests that are valid but unsafe, incomplete or contradictory.

The validator refuses what cannot work; lint points at what works but will hurt someone
later (nobody to page, an undo nobody reads back, an argument the real tool does not take).
Each L-code of tool-manifests.txt is one small function in ``RULES``, an ordered table that
also fixes the code's level, so a level is stated once and a code cannot be reported at two.

"Mutating" means every effect except read_only (idempotent tools change things too, they
are just safe to repeat). Rules that compare against the real tools' input schemas
(L017, L020, L027, L033, L034, L035) run only when upstream schemas are given; a schema
without a ``properties`` mapping is opaque and its arguments are not judged. A manifest is
matched to its upstream schema by ``upstream.mcp.tool`` when set, else by its tool name.

Schemas come in two forms. ``upstream_schemas`` is one flat list (tool name -> schema) that
every manifest is judged against. ``upstreams`` is per server (an MCP server's URL -> its
``tools/list``): a manifest is judged only against the list of the server its
``upstream.mcp.url`` names, so an MCP server's list says nothing about a REST tool (no L034)
and a tool of one server is not "missing" from another's list.

L037 (mapping_type_mismatch) compares the types a mapping sends with the types the target
tool declares (its manifest's ``input_schema`` when it has one, else its upstream schema); it
runs whenever both sides declare a type. L038 lists the ``# TODO`` comments a person must
still resolve (``unwind manifests scaffold`` writes them); the loader finds them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal
from urllib.parse import urlsplit

from .canonical import canonical_json
from .keys import placeholders
from .lint_trust import l041_open_input_schema, l042_batch_undone_by_the_callers_names
from .lint_undo import (
    l043_divergence_compares_with_the_answer,
    l044_run_key_shared_across_runs,
    l045_no_lookup_for_a_lost_answer,
)
from .model import Effect, Lifecycle, ToolManifest
from .refs import RefSyntaxError, parse_ref
from .undo_refs import kept_references, redacted_needs
from .validate import find_requires_cycles

Level = Literal["error", "warning", "info"]


@dataclass(frozen=True)
class Finding:
    """One lint finding: the code and its level, the tool and the field it is about, and
    (once located by the caller) the file and line of that field."""

    code: str
    level: Level
    tool: str
    message: str
    path: str = ""
    file: str | None = None
    line: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "level": self.level, "tool": self.tool, "path": self.path,
                "message": self.message, "file": self.file, "line": self.line}

    def located(self, file: str | None, line: int | None) -> Finding:
        return replace(self, file=file, line=line)

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}: " if self.file and self.line else (
            f"{self.file}: " if self.file else "")
        field = f"{self.path}: " if self.path and not self.message.startswith(self.path) else ""
        return f"{where}{self.level:<7} {self.code}  {self.tool}: {field}{self.message}"


@dataclass(frozen=True)
class Context:
    manifests: Sequence[ToolManifest]
    by_name: Mapping[str, ToolManifest]
    upstream: Mapping[str, dict[str, Any]]  # empty when no upstream was given
    upstreams: Mapping[str, Mapping[str, dict[str, Any]]] = field(default_factory=dict)
    flat: bool = False  # a flat list was given: it judges every manifest
    todos: Mapping[str, Sequence[tuple[str, str]]] = field(default_factory=dict)


Check = Callable[[Context], Iterator[tuple[str, str, str]]]  # yields (tool, field path, message)


def schema_hash_of(schema: Mapping[str, Any]) -> str:
    """``sha256:`` + the first 16 hex digits of the canonical JSON of an input schema."""
    return "sha256:" + hashlib.sha256(canonical_json(schema)).hexdigest()[:16]


def _mutating(ctx: Context) -> Iterator[ToolManifest]:
    return (m for m in ctx.manifests if m.effect != Effect.read_only)


def upstream_name(m: ToolManifest) -> str:
    """The name the upstream knows the tool by: ``upstream.mcp.tool`` when the manifest
    routes to an MCP server's tool, else the manifest's own name."""
    return m.upstream.mcp.tool if m.upstream and m.upstream.mcp else m.tool


def _mcp_url(m: ToolManifest) -> str | None:
    return m.upstream.mcp.url if m.upstream and m.upstream.mcp else None


def _server(ctx: Context, m: ToolManifest) -> str | None:
    """The key in ``ctx.upstreams`` of the server ``m`` routes to (a trailing ``/`` aside)."""
    url = _mcp_url(m)
    if url is None:
        return None
    return next((k for k in ctx.upstreams if k.rstrip("/") == url.rstrip("/")), None)


def upstream_list(ctx: Context, m: ToolManifest) -> Mapping[str, dict[str, Any]] | None:
    """The tool list ``m`` is judged against: its MCP server's when that server's list was
    read, else the flat list when one was given, else None (nothing to judge it by)."""
    server = _server(ctx, m)
    if server is not None:
        return ctx.upstreams[server]
    return ctx.upstream if ctx.flat else None


def _upstream_schema(ctx: Context, m: ToolManifest) -> dict[str, Any] | None:
    found = upstream_list(ctx, m)
    return found.get(upstream_name(m)) if found is not None else None


def input_schema_of(ctx: Context, m: ToolManifest) -> Mapping[str, Any] | None:
    """The tool's input schema: its manifest's own ``input_schema`` when it declares one,
    else the upstream's."""
    own = getattr(m, "input_schema", None)
    return own if isinstance(own, Mapping) else _upstream_schema(ctx, m)


def _schema_properties(ctx: Context, m: ToolManifest) -> Mapping[str, Any] | None:
    """The input schema's properties, or None when unknown or opaque (nothing to judge)."""
    schema = _upstream_schema(ctx, m)
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return props if isinstance(props, Mapping) else None


def _arg_name(raw: Any) -> str | None:
    """The first segment of an ``$args`` reference, or None for anything else."""
    try:
        ref = parse_ref(raw)
    except RefSyntaxError:
        return None
    return str(ref.path[0]) if ref.root == "args" and ref.path else None


def _missing_args(ctx: Context, m: ToolManifest,
                  places: Iterator[tuple[str, Any]]) -> Iterator[tuple[str, str]]:
    props = _schema_properties(ctx, m)
    if props is None:
        return
    for where, raw in places:
        name = _arg_name(raw)
        if name is not None and name not in props:
            known = ", ".join(sorted(map(str, props))) or "none"
            yield where, f"{name!r} (the input schema of {m.tool} has: {known})"


# ---- the codes --------------------------------------------------------------------------

def l010_no_description(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in _mutating(ctx):
        if not (m.description or "").strip():
            yield m.tool, "description", ("mutating tool has no description: reviewers cannot tell what it "
                           "changes; add description: one sentence on the effect")


def l011_no_owner(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in _mutating(ctx):
        if not any(o.strip() for o in m.owner):
            yield m.tool, "owner", ("mutating tool has no owner: nobody is named to ask when it "
                           "misbehaves; add owner: [a team or person]")


def l012_no_data_class(ctx: Context) -> Iterator[tuple[str, str, str]]:
    # Mutating tools only, as in the documented example (a read-only tool without risk
    # is not reported): what policy and retention weigh is what a call changes.
    for m in _mutating(ctx):
        if m.risk is None or not (m.risk.data_class or "").strip():
            yield m.tool, "risk.data_class", ("no risk.data_class: policy and retention cannot treat sensitive "
                           "data differently; add risk: {data_class: pii, financial, ...}")


def l013_compensable_without_residue(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        c = m.compensation
        # An inverse cannot list residue; L031 reports that contradiction instead.
        if m.effect == Effect.compensable and c and c.kind == "compensation" and not c.residue:
            yield m.tool, "compensation.residue", ("compensable but no residue declared: a reviewer cannot see what a "
                           "rollback leaves behind; list it in compensation.residue")


def l014_compensation_not_idempotent(ctx: Context) -> Iterator[tuple[str, str, str]]:
    # A read-only undo is as safe to retry as an idempotent one; an undo with no manifest
    # is the validator's error, not lint's.
    for m in ctx.manifests:
        undo = ctx.by_name.get(m.compensation.tool) if m.compensation else None
        if undo is not None and undo.effect not in (Effect.idempotent, Effect.read_only):
            yield m.tool, "compensation.tool", (f"the compensation tool {undo.tool} is {undo.effect}, not idempotent, "
                           "but rollback retries it and may repeat its effect; make it "
                           "idempotent or use an idempotent undo")


def l015_irreversible_unbounded(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if (m.effect == Effect.irreversible and not m.approval.roles
                and (m.risk is None or m.risk.blast_radius is None)):
            yield m.tool, "risk", ("irreversible with no blast_radius and no approvers: any approver "
                           "may wave through an effect nothing can undo; set "
                           "risk.blast_radius and approval.roles")


def l016_undo_not_verified(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.compensation and m.compensation.verification is None:
            yield m.tool, "compensation", ("the undo is not verified: an API that answers ok and does "
                           "nothing would count as undone; add compensation.verification")


def l017_mapped_argument_not_in_schema(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        c = m.compensation
        if c is None:
            continue
        places = [(f"compensation.argument_map.{k}", v) for k, v in c.argument_map.items()]
        if c.verification:
            places += [(f"compensation.verification.arguments.{k}", v)
                       for k, v in c.verification.arguments.items()]
        for where, what in _missing_args(ctx, m, iter(places)):
            yield m.tool, where, (f"{where} reads the argument {what}, so the undo would be built "
                           "from a value the tool never receives; fix the reference")


def l019_read_only_shares_permission(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.effect != Effect.read_only:
            continue
        writers = sorted(w.tool for w in _mutating(ctx) if w.permission == m.permission)
        if writers:
            yield m.tool, "permission", (f"read-only tool shares the permission {m.permission} with tools "
                           f"that change things ({', '.join(writers)}): granting reads grants "
                           "writes; give the read-only tool its own permission")


def l020_key_argument_not_in_schema(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.idempotency is None:
            continue
        refs = iter([("idempotency.key", "$" + name) for name in placeholders(m.idempotency.key)
                     if name.startswith("args.")])
        for where, what in _missing_args(ctx, m, refs):
            yield m.tool, where, (f"{where} uses the argument {what}, so every call would be refused "
                           "as unkeyable; fix the key template")


def l021_irreversible_without_evidence(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.effect == Effect.irreversible and (m.audit is None
                                                or m.audit.evidence_export != "required"):
            yield m.tool, "audit.evidence_export", ("irreversible without audit.evidence_export: required: the record "
                           "of an effect nothing can undo may be left out of evidence exports; "
                           "set audit: {evidence_export: required}")


def l022_no_timeout(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in _mutating(ctx):
        if m.timeout_ms is None:
            yield m.tool, "timeout_ms", ("no timeout_ms: a hung call is only bounded by the gateway default; "
                           "set timeout_ms to the longest the upstream may take")


def l023_requires_cycle(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for cycle in find_requires_cycles(ctx.manifests):
        yield cycle[0], "requires", ("requires forms a cycle (" + " -> ".join(cycle) + "): no run can "
                         "satisfy it and rollback has no order; remove one requirement")


def l024_draft(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.lifecycle == Lifecycle.draft:
            yield m.tool, "lifecycle", ("draft manifest: calls to this tool are refused until it is "
                           "approved; approve it or set lifecycle: approved")


def l027_no_schema_hash(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        schema = _upstream_schema(ctx, m)
        if schema is not None and not m.schema_hash:
            yield m.tool, "schema_hash", ("no schema_hash: a change of the upstream's input schema would go "
                           f"unnoticed; set schema_hash: {schema_hash_of(schema)}")


def l030_reversible_with_residue(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.effect == Effect.reversible and m.compensation and m.compensation.residue:
            yield m.tool, "compensation.residue", ("declared reversible but the compensation lists residue: an undo "
                           "that leaves a trace is compensable; set effect: compensable or "
                           "remove the residue")


def l031_compensable_but_inverse(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.effect == Effect.compensable and m.compensation and m.compensation.kind == "inverse":
            yield m.tool, "compensation.kind", ("declared compensable but the compensation is an exact inverse: "
                           "set effect: reversible, or kind: compensation if a trace remains")


def _method(m: ToolManifest | None) -> str | None:
    u = m.upstream if m is not None else None
    return u.method if u is not None and u.url is not None else None


def l039_update_undone_without_before(ctx: Context) -> Iterator[tuple[str, str, str]]:
    """An update (PUT or PATCH) overwrites a value that neither its arguments nor its
    answer hold: an undo that reads no ``$before`` cannot put the old value back. A PUT
    undone by a DELETE is a create (``PUT /db/<id>`` of an API that refuses a PUT without
    the current revision): there was nothing before it to restore."""
    for m in ctx.manifests:
        c, u = m.compensation, m.upstream
        if c is None or u is None or u.url is None or u.method not in ("PUT", "PATCH"):
            continue
        if any(isinstance(raw, str) and raw.strip().startswith("$before")
               for raw in c.argument_map.values()):
            continue
        if u.method == "PUT" and _method(ctx.by_name.get(c.tool)) == "DELETE":
            continue
        yield m.tool, "compensation.argument_map", (
            f"{m.tool} is a {u.method}: it overwrites values, and its undo {c.tool} reads no "
            "$before, so it cannot restore what was there: add capture: {tool: <a read_only "
            "tool>, arguments: {...}} and map the old values as $before.<field>")


def l040_idempotent_overwrite(ctx: Context) -> Iterator[tuple[str, str, str]]:
    """An idempotent PUT or PATCH is safe to repeat, but its first call overwrote what was
    there, and an idempotent tool has no undo: a rollback leaves the old values lost."""
    for m in ctx.manifests:
        method = _method(m)
        if m.effect == Effect.idempotent and method in ("PUT", "PATCH") and m.capture is None:
            yield m.tool, "effect", (
                f"{m.tool} is an idempotent {method}: repeating it is safe, but its first call "
                "overwrites what was there and a rollback leaves it overwritten: to undo it, "
                "declare effect: reversible, capture: {tool: <a read_only tool>, arguments: "
                "{...}}, and an inverse that restores $before.<field>")


def l032_compensation_takes_nothing(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        c = m.compensation
        if c is None:
            continue
        roots: set[str] = set()
        for raw in c.argument_map.values():
            try:
                roots.add(parse_ref(raw).root)
            except RefSyntaxError:
                roots.add("invalid")  # the validator reports it; do not pile on
        if not roots & {"args", "result", "invalid"}:
            yield m.tool, "compensation.argument_map", ("the compensation takes no arguments from the call: the undo cannot "
                           "know which effect to undo; map $args or $result values in "
                           "compensation.argument_map")


def l033_redaction_not_in_schema(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        if m.audit is None:
            continue
        refs = iter([(f"audit.redaction[{i}]", r) for i, r in enumerate(m.audit.redaction)])
        for where, what in _missing_args(ctx, m, refs):
            yield m.tool, where, (f"{where} names the argument {what}: the value it meant to keep out "
                           "of the ledger may be stored under another name; fix the path")


def l036_redaction_hides_what_the_undo_needs(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        needs = redacted_needs(m, kept_references(m, staged=True))
        if needs:
            yield m.tool, "audit.redaction", ("; ".join(needs) + ": the undo of every call will be "
                                              "unavailable; redact something else, or read the undo's "
                                              "value from another place")


def _origin(m: ToolManifest) -> str:
    """Which upstream a tool is served by: its MCP server (URL or command), else its REST
    API's scheme and host."""
    u = m.upstream
    if u is None:
        return ""
    if u.mcp is not None:
        return u.mcp.target
    return urlsplit(u.url or "")._replace(path="", query="", fragment="").geturl()


def l034_no_upstream_tool(ctx: Context) -> Iterator[tuple[str, str, str]]:
    """A flat list (``--upstream-schemas``) judges the upstreams it names a tool of: in a
    set that mixes an MCP server's tools and REST tools, a list read from the server says
    nothing about the REST tools (nor one server's list about another server's tools)."""
    covered = {_origin(m) for m in ctx.manifests if upstream_name(m) in ctx.upstream}
    for m in ctx.manifests:
        listed = upstream_list(ctx, m)
        if listed is None or upstream_name(m) in listed:
            continue
        if _server(ctx, m) is None and _origin(m) not in covered:
            continue
        server = _server(ctx, m)
        where = f" at {server}" if server is not None else ""
        yield m.tool, "upstream", (f"no upstream tool{where} is named {upstream_name(m)}: calls "
                                   "cannot reach it; fix the tool name or remove the manifest")


def l035_upstream_without_manifest(ctx: Context) -> Iterator[tuple[str, str, str]]:
    if ctx.flat:
        declared = {upstream_name(m) for m in ctx.manifests}
        for name in sorted(ctx.upstream):
            if name not in declared:
                yield name, "", ("the upstream offers this tool but no manifest declares it: "
                                 "agents cannot call it through the gateway; write a manifest for it")
    for url, listed in ctx.upstreams.items():
        declared = {upstream_name(m) for m in ctx.manifests if _server(ctx, m) == url}
        for name in sorted(listed):
            if name not in declared:
                yield name, "", (f"the upstream {url} offers this tool but no manifest declares "
                                 "it: agents cannot call it through the gateway; write a manifest "
                                 "for it (unwind manifests scaffold --from-mcp writes a draft)")


# ---- mapping types (L037) -------------------------------------------------------------------

_JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


def _literal_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _declared_types(schema: Any) -> set[str] | None:
    """The JSON types a schema allows, or None when it does not say (not judged)."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, str) and kind in _JSON_TYPES:
        return {kind}
    if isinstance(kind, list) and kind and all(k in _JSON_TYPES for k in kind):
        return set(kind)
    return None


def _schema_at(schema: Any, path: Sequence[Any]) -> Any:
    """The sub-schema at a reference path (names through properties, indices through
    items), or None when the schema does not declare it."""
    current = schema
    for seg in path:
        if not isinstance(current, Mapping):
            return None
        if isinstance(seg, str):
            props = current.get("properties")
            current = props.get(seg) if isinstance(props, Mapping) else None
        else:  # an index, or the [*] of a projection
            current = current.get("items")
    return current


def _fits(sent: set[str], wanted: set[str]) -> bool:
    """Every type that may be sent is accepted; an integer fits a number, nothing else
    converts."""
    return all(t in wanted or (t == "integer" and "number" in wanted) for t in sent)


def _mapped_types(ctx: Context, m: ToolManifest, raw: Any) -> set[str] | None:
    """The JSON types a mapped value may have, or None when nothing declares them."""
    try:
        ref = parse_ref(raw)
    except RefSyntaxError:
        return None
    if ref.root == "const":
        return {_literal_type(ref.value)}
    if getattr(ref, "projects", False):
        return {"array"}  # a projection is always a list
    if ref.root == "args":
        return _declared_types(_schema_at(input_schema_of(ctx, m), ref.path))
    return None  # $result, $before, $key: no schema declares them here


def _argument_maps(m: ToolManifest) -> Iterator[tuple[str, str, Mapping[str, Any]]]:
    """(field path, target tool, mapping) for each argument map that calls another tool."""
    c = m.compensation
    if c is not None:
        yield "compensation.argument_map", c.tool, c.argument_map
        if c.verification is not None:
            yield "compensation.verification.arguments", c.verification.tool, c.verification.arguments
    if m.lookup is not None:
        yield "lookup.arguments", m.lookup.tool, m.lookup.arguments
    capture = getattr(m, "capture", None)
    if capture is not None:
        yield "capture.arguments", capture.tool, capture.arguments
    if m.draft is not None:
        yield "draft.arguments", m.draft.tool, m.draft.arguments


def l037_mapping_type_mismatch(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        for place, target_name, mapping in _argument_maps(m):
            target = ctx.by_name.get(target_name)
            schema = input_schema_of(ctx, target) if target is not None else None
            props = schema.get("properties") if isinstance(schema, Mapping) else None
            if not isinstance(props, Mapping):
                continue
            for name, raw in mapping.items():
                wanted = _declared_types(props.get(name))
                sent = _mapped_types(ctx, m, raw)
                if wanted is None or sent is None or _fits(sent, wanted):
                    continue
                shown = raw if isinstance(raw, str) else parse_ref(raw).text()
                want = " or ".join(sorted(wanted))
                fix = (" (map a list: a projection such as $result.items[*].id, or a {const: [...]})"
                       if wanted == {"array"} else "")
                yield m.tool, f"{place}.{name}", (
                    f"{place}.{name} sends {shown} ({' or '.join(sorted(sent))}), but {target_name} "
                    f"takes {name} as {want}: the call would be refused or misread{fix}; map a "
                    "value of that type")


# ---- TODOs left by a person or by scaffold (L038) -----------------------------------------

def l038_todo(ctx: Context) -> Iterator[tuple[str, str, str]]:
    for m in ctx.manifests:
        for path, text in ctx.todos.get(m.tool, ()):
            yield m.tool, path, (f"TODO left: {text}" if text else "a TODO is left here") + (
                " (decide, write it in the manifest, then remove the comment)")


@dataclass(frozen=True)
class Rule:
    code: str
    level: Level
    check: Check
    needs_upstream: bool = False


RULES: tuple[Rule, ...] = (
    Rule("L010", "warning", l010_no_description),
    Rule("L011", "warning", l011_no_owner),
    Rule("L012", "warning", l012_no_data_class),
    Rule("L013", "warning", l013_compensable_without_residue),
    Rule("L014", "warning", l014_compensation_not_idempotent),
    Rule("L015", "warning", l015_irreversible_unbounded),
    Rule("L016", "info", l016_undo_not_verified),
    Rule("L017", "error", l017_mapped_argument_not_in_schema, needs_upstream=True),
    Rule("L019", "warning", l019_read_only_shares_permission),
    Rule("L020", "error", l020_key_argument_not_in_schema, needs_upstream=True),
    Rule("L021", "info", l021_irreversible_without_evidence),
    Rule("L022", "info", l022_no_timeout),
    Rule("L023", "error", l023_requires_cycle),
    Rule("L024", "warning", l024_draft),
    Rule("L027", "info", l027_no_schema_hash, needs_upstream=True),
    Rule("L030", "warning", l030_reversible_with_residue),
    Rule("L031", "warning", l031_compensable_but_inverse),
    Rule("L032", "info", l032_compensation_takes_nothing),
    Rule("L033", "warning", l033_redaction_not_in_schema, needs_upstream=True),
    Rule("L034", "warning", l034_no_upstream_tool, needs_upstream=True),
    Rule("L035", "warning", l035_upstream_without_manifest, needs_upstream=True),
    Rule("L036", "warning", l036_redaction_hides_what_the_undo_needs),
    Rule("L037", "error", l037_mapping_type_mismatch),
    Rule("L038", "info", l038_todo),
    Rule("L039", "warning", l039_update_undone_without_before),
    Rule("L040", "warning", l040_idempotent_overwrite),
    Rule("L041", "warning", l041_open_input_schema),
    Rule("L042", "warning", l042_batch_undone_by_the_callers_names),
    Rule("L043", "warning", l043_divergence_compares_with_the_answer),
    Rule("L044", "warning", l044_run_key_shared_across_runs),
    Rule("L045", "info", l045_no_lookup_for_a_lost_answer),
)


def lint(manifests: Sequence[ToolManifest],
         upstream_schemas: Mapping[str, dict[str, Any]] | None = None,
         upstreams: Mapping[str, Mapping[str, dict[str, Any]]] | None = None,
         todos: Mapping[str, Sequence[tuple[str, str]]] | None = None) -> list[Finding]:
    """Every finding, sorted stably by tool then code (rule order within one code).
    ``upstream_schemas``: one flat tool list for every manifest; ``upstreams``: each MCP
    server's list by its URL; ``todos``: tool -> (field path, text) of its TODO comments."""
    ctx = Context(manifests, {m.tool: m for m in manifests}, upstream_schemas or {},
                  upstreams or {}, upstream_schemas is not None, todos or {})
    given = upstream_schemas is not None or bool(upstreams)
    findings = [Finding(rule.code, rule.level, tool, message, path)
                for rule in RULES if given or not rule.needs_upstream
                for tool, path, message in rule.check(ctx)]
    return sorted(findings, key=lambda f: (f.tool, f.code))


def counts(findings: Sequence[Finding]) -> tuple[int, int, int]:
    """(errors, warnings, notes); info findings count as notes."""
    levels = [f.level for f in findings]
    return levels.count("error"), levels.count("warning"), levels.count("info")


# ---- silencing ----------------------------------------------------------------------------
# A finding someone has weighed and accepted should not fail every CI run, but nor should
# it vanish: a silenced finding is still listed, with who silenced it and why. Two ways:
# `--disable CODE` for a whole run, and, in a ToolManifest resource, the annotation
# `ignore-check.unwind.dev/<CODE>: "<reason>"` (the convention kube-linter uses) for one
# manifest; a reason is required there, because the annotation outlives the review.

IGNORE_PREFIX = "ignore-check.unwind.dev/"
CODES = frozenset(rule.code for rule in RULES)


@dataclass(frozen=True)
class Silenced:
    finding: Finding
    reason: str  # the annotation's reason, or "--disable"

    def to_json(self) -> dict[str, Any]:
        return {**self.finding.to_json(), "reason": self.reason}


def ignores_from_annotations(annotations: Mapping[str, str]) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(code -> reason, problems as (annotation, message)) from one resource's annotations."""
    ignores: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    for key, value in annotations.items():
        if not key.startswith(IGNORE_PREFIX):
            continue
        code = key.removeprefix(IGNORE_PREFIX)
        if code not in CODES:
            problems.append((key, f"{code!r} is not a lint code (codes: {', '.join(sorted(CODES))})"))
        elif not str(value).strip():
            problems.append((key, "say why the finding is accepted: the reason is what a reviewer "
                             "reads, e.g. \"verified by the nightly reconciliation job\""))
        else:
            ignores[code] = str(value).strip()
    return ignores, problems


def silence(findings: Sequence[Finding], disabled: Iterable[str] = (),
            ignores: Mapping[str, Mapping[str, str]] | None = None) -> tuple[list[Finding], list[Silenced]]:
    """Split findings into those that count and those silenced: by ``disabled`` codes, or
    by ``ignores`` (tool -> code -> reason)."""
    off = set(disabled)
    kept: list[Finding] = []
    quiet: list[Silenced] = []
    for f in findings:
        reason = "--disable" if f.code in off else (ignores or {}).get(f.tool, {}).get(f.code)
        if reason is None:
            kept.append(f)
        else:
            quiet.append(Silenced(f, reason))
    return kept, quiet


def _count(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def lint_report_json(findings: Sequence[Finding], silenced: Sequence[Silenced] = ()) -> dict[str, Any]:
    errors, warnings, notes = counts(findings)
    return {"findings": [f.to_json() for f in findings],
            "errors": errors, "warnings": warnings, "notes": notes,
            "silenced": [s.to_json() for s in silenced]}


def lint_report_text(findings: Sequence[Finding], silenced: Sequence[Silenced] = ()) -> str:
    """The CLI's listing: one line per finding, then the totals."""
    errors, warnings, notes = counts(findings)
    lines = [str(f) for f in findings]
    total = f"{_count(errors, 'error')}, {_count(warnings, 'warning')}, {_count(notes, 'note')}"
    if silenced:
        total += f"; {len(silenced)} silenced (listed with -o json)"
    lines.append(total)
    return "\n".join(lines)
