"""Draft manifests from what a server says about itself: an MCP server's ``tools/list`` or
an OpenAPI document (``unwind manifests scaffold``). Pure: the caller reads the source and
writes the files.

Each draft is a bare manifest with ``lifecycle: draft`` (never enforced until a person
approves it) that validates as written. What the source states is copied: the input schema
(``input_schema`` for an HTTP tool, when the model has the field; an MCP server serves its
own) and its ``schema_hash``, the description, the upstream (an OpenAPI path's ``{id}``
becomes ``{{args.id}}``). What the source only hints at is written as a suggestion with a
comment saying where it came from: the effect, from MCP annotations (``readOnlyHint`` ->
read_only, ``idempotentHint`` -> idempotent, ``destructiveHint`` -> irreversible) or from
the HTTP method (GET read_only, PUT/DELETE idempotent, POST compensable when a DELETE of the
created thing exists, else irreversible). What only a person can decide (how the effect is
undone, what an undo leaves behind, how the undo is read back, the credentials) is a
``# TODO`` comment, and ``unwind lint`` lists each one (L038) until it is resolved.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml.comments import CommentedMap

from .input_schema import schema_problems
from .lint import schema_hash_of
from .model import TOOL_NAME_PATTERN, ToolManifest
from .openapi_refs import Defs, TooLarge, deref
from .scaffold_yaml import draft_problem, dump, escaped, plain

_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.:/-]+")
_PATH_PARAM = re.compile(r"\{([^{}]+)\}")
_ARG_NAME = re.compile(r"[A-Za-z0-9_-]+")
_METHODS = ("get", "put", "post", "patch", "delete")
_UNDO_WORDS = {"create": ("delete", "remove"), "add": ("remove", "delete"),
               "insert": ("delete", "remove"), "open": ("close",), "start": ("stop", "cancel")}


class ScaffoldError(ValueError):
    """The source cannot be turned into drafts; the message says what to give instead."""


@dataclass
class Draft:
    """One draft manifest: its tool name, the file name to write it to, and its text."""

    tool: str
    filename: str
    text: str
    todos: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was left out, for the command's report
    data: Any = None  # what the text means (plain JSON values): a re-read must find exactly it


@dataclass
class _Tool:
    """What a source says about one tool, before it is written as YAML."""

    name: str
    source_name: str  # the name the source knows it by (MCP tool, operationId or METHOD path)
    description: str | None
    schema: dict[str, Any]
    effect: str
    effect_why: str
    effect_todo: str | None = None
    upstream: CommentedMap = field(default_factory=CommentedMap)
    undo: str | None = None  # the tool that likely undoes this one
    undo_map: dict[str, str] = field(default_factory=dict)
    read_back: str | None = None
    auth_todo: str | None = None
    notes: list[str] = field(default_factory=list)
    keep_schema: bool = True  # write input_schema (an HTTP tool's, when it is bounded)


def tool_name(text: str, prefix: str = "") -> str:
    """A valid tool name from a source's name: characters outside the pattern become ``_``."""
    name = _NOT_NAME.sub("_", prefix + text).strip("_") or "tool"
    return name[:128]


def _permission(prefix: str, effect: str) -> str:
    base = re.sub(r"[^A-Za-z0-9_-]+", "-", prefix.rstrip(".:/-_")).strip("-") or "tools"
    return f"{base}:{'read' if effect == 'read_only' else 'write'}"


# ---- MCP --------------------------------------------------------------------------------------

def _mcp_effect(annotations: Mapping[str, Any]) -> tuple[str, str, str | None]:
    """(effect, why, TODO or None) from MCP tool annotations. Unset hints take the MCP
    defaults (readOnlyHint false, destructiveHint true, idempotentHint false)."""
    if annotations.get("readOnlyHint") is True:
        return "read_only", "suggested from readOnlyHint: true; review", None
    destructive = annotations.get("destructiveHint", True) is not False
    idempotent = annotations.get("idempotentHint") is True
    if not destructive and idempotent:
        return "idempotent", "suggested from idempotentHint: true, destructiveHint: false; review", None
    if destructive:
        why = ("suggested from destructiveHint: true" if "destructiveHint" in annotations
               else "suggested: the server gives no annotations, and MCP assumes destructive")
        return "irreversible", why + "; review", (
            "if another tool undoes this one, set effect: compensable (or reversible) and add "
            "compensation: {tool, argument_map}; otherwise keep irreversible (each call is approved)")
    return "compensable", "suggested from destructiveHint: false (it adds); review", None


def _source_name_problem(name: str) -> str | None:
    """Why an MCP server's tool name cannot be adopted as it is, or None. MCP asks for 1 to
    128 letters, digits, ``_``, ``-`` and ``.``; Unwind's tool names allow ``:`` and ``/``
    too. A name outside that is refused rather than changed: the draft's ``upstream.mcp.tool``
    must be the exact name the server answers to, and no real server needs more."""
    if _TOOL_NAME.fullmatch(name) and "\n" not in name:
        return None
    return (f"its name '{escaped(name[:80])}{'...' if len(name) > 80 else ''}' is not a tool name "
            "(1 to 128 letters, digits and _ . : / -): not scaffolded; write its manifest by "
            "hand if the server really names it so")


def from_mcp(tools: Sequence[Mapping[str, Any]], server: str | Sequence[str], prefix: str = "",
             skipped: list[str] | None = None) -> list[Draft]:
    """Drafts for each tool of an MCP ``tools/list`` (each a mapping with ``name``,
    ``description``, ``inputSchema``, ``annotations``, as the protocol writes them).
    ``server`` is the streamable HTTP URL, or the stdio command (argv) the drafts name in
    ``upstream.mcp``. Tools whose names cannot be adopted are left out, each with a line
    in ``skipped``."""
    parsed: list[_Tool] = []
    for raw in tools:
        source_name = str(raw.get("name") or "")
        if not source_name:
            continue
        problem = _source_name_problem(source_name)
        if problem is not None:
            if skipped is not None:
                skipped.append(problem)
            continue
        schema = raw.get("inputSchema")
        schema = dict(schema) if isinstance(schema, Mapping) else {"type": "object"}
        annotations = raw.get("annotations")
        effect, why, todo = _mcp_effect(annotations if isinstance(annotations, Mapping) else {})
        upstream = CommentedMap()
        where: Any = ("url", server) if isinstance(server, str) else ("command", list(server))
        upstream["mcp"] = CommentedMap([where, ("tool", source_name)])
        description = raw.get("description")
        parsed.append(_Tool(tool_name(source_name, prefix), source_name,
                            str(description).strip() if description else None, schema, effect,
                            why, todo, upstream))
    _pair_undos(parsed)
    command = (f"--from-mcp {server}" if isinstance(server, str)
               else "--from-mcp -- " + shlex.join(server))
    return [_write(t, prefix, command, mcp=True) for t in parsed]


def _pair_undos(tools: list[_Tool]) -> None:
    """Guess the undo of each compensable tool by name (create_entities -> delete_entities)
    and the read-back (get_/read_ + the same noun); without an undo, the tool becomes
    irreversible with a TODO, so the draft still validates."""
    by_source = {t.source_name: t for t in tools}
    for t in tools:
        if t.effect != "compensable" or t.undo is not None:
            continue
        verb, sep, noun = t.source_name.partition("_")
        for undo_verb in _UNDO_WORDS.get(verb.lower(), ()) if sep else ():
            other = by_source.get(f"{undo_verb}_{noun}")
            if other is not None and other is not t:
                t.undo = other.name
                required = other.schema.get("required") if isinstance(other.schema, Mapping) else None
                names = [str(n) for n in required] if isinstance(required, list) else []
                props = other.schema.get("properties")
                if not names and isinstance(props, Mapping):
                    names = [str(n) for n in props][:1]
                t.undo_map = {n: f"$result.{n}" if _ARG_NAME.fullmatch(n) else "$result.id"
                              for n in names if _ARG_NAME.fullmatch(n)} or {"id": "$result.id"}
                break
        for read_verb in ("get", "read", "describe", "show"):
            other = by_source.get(f"{read_verb}_{noun}") if sep else None
            if other is not None and other.effect == "read_only":
                t.read_back = other.name
                break
        if t.undo is None:
            t.effect, t.effect_why = "irreversible", t.effect_why.replace("; review", "") + (
                ", but no tool that undoes it was found; review")
            t.effect_todo = ("name the tool that undoes this one: set effect: compensable and add "
                             "compensation: {tool, argument_map}; or keep irreversible")


# ---- OpenAPI ----------------------------------------------------------------------------------

def _base_url(doc: Mapping[str, Any], base_url: str | None) -> str:
    if base_url:
        chosen = base_url
    else:
        servers = doc.get("servers")
        first = servers[0] if isinstance(servers, list) and servers and isinstance(servers[0], Mapping) else {}
        chosen = str(first.get("url") or "")
        variables = first.get("variables")
        for name, var in (variables.items() if isinstance(variables, Mapping) else []):
            default = var.get("default") if isinstance(var, Mapping) else None
            chosen = chosen.replace("{" + str(name) + "}", str(default or ""))
    if not chosen.startswith(("http://", "https://")) or "{" in chosen:
        raise ScaffoldError(
            f"the document's servers give no absolute http(s) URL to call (found {chosen!r}): "
            "pass --base-url https://api.example.com")
    return chosen.rstrip("/")


def _input_schema(doc: Mapping[str, Any], op: Mapping[str, Any], shared: Any, defs: Defs) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the operation's input schema, its path parameters, notes) from its parameters and
    its JSON request body; referenced schemas stay references, under ``$defs``."""
    props: dict[str, Any] = {}
    required: list[str] = []
    path_params: list[str] = []
    notes: list[str] = []
    needed: dict[str, Any] = {}

    def copy(node: Any) -> Any:
        copied, wants = defs.schema(node)
        needed.update(wants)
        return copied
    params = [p for given in (shared, op.get("parameters")) if isinstance(given, list) for p in given]
    for raw in params:
        p = deref(doc, raw)
        if not isinstance(p, Mapping) or not isinstance(p.get("name"), str):
            continue
        where, name = p.get("in"), p["name"]
        if where not in ("path", "query"):
            notes.append(f"{escaped(str(where))} parameter {escaped(name)!r} left out (set it in "
                         "upstream.headers)")
            continue
        schema = copy(p.get("schema") or {})
        props[name] = schema if isinstance(schema, dict) else {}
        if p.get("description"):
            props[name].setdefault("description", str(p["description"]))
        if where == "path":
            path_params.append(name)
        if p.get("required") or where == "path":
            required.append(name)
    body = deref(doc, op.get("requestBody") or {})
    content = body.get("content") if isinstance(body, Mapping) else None
    json_body = content.get("application/json") if isinstance(content, Mapping) else None
    schema = deref(doc, json_body.get("schema")) if isinstance(json_body, Mapping) else None
    if isinstance(schema, Mapping):
        body_props = schema.get("properties")
        if isinstance(body_props, Mapping):
            props.update({str(k): copy(v) for k, v in body_props.items()})
            listed = schema.get("required")
            required += [str(n) for n in (listed if isinstance(listed, list) else [])
                         if str(n) not in required]
        else:
            notes.append("the JSON body is not an object with properties: its schema is left out")
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    if needed:
        out["$defs"] = dict(sorted(needed.items()))
    return out, path_params, notes


def _template(path: str, names: Sequence[str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        return "{{args." + name + "}}" if _ARG_NAME.fullmatch(name) else match.group(0)
    return _PATH_PARAM.sub(one, path)


def from_openapi(doc: Mapping[str, Any], base_url: str | None = None, prefix: str = "",
                 source: str = "the OpenAPI document") -> list[Draft]:
    """Drafts for each operation of an OpenAPI 3 document (a JSON or YAML mapping)."""
    if not isinstance(doc.get("paths"), Mapping):
        raise ScaffoldError("not an OpenAPI document: it has no paths mapping")
    base = _base_url(doc, base_url)
    components = doc.get("components")
    secured = bool(doc.get("security")) or (isinstance(components, Mapping)
                                            and bool(components.get("securitySchemes")))
    tools: list[_Tool] = []
    by_route: dict[tuple[str, str], _Tool] = {}
    defs = Defs(doc)
    for path, item in doc["paths"].items():
        if not isinstance(item, Mapping):
            continue
        shared = item.get("parameters")
        for method in _METHODS:
            op = item.get(method)
            if not isinstance(op, Mapping):
                continue
            try:
                schema, path_params, notes = _input_schema(doc, op, shared, defs)
            except TooLarge as exc:
                raise ScaffoldError(str(exc)) from None
            source_name = str(op.get("operationId") or f"{method}_{path}")
            effect, why = {
                "get": ("read_only", "suggested from GET; review"),
                "put": ("idempotent", "suggested from PUT; review"),
                "delete": ("idempotent", "suggested from DELETE; review"),
                "patch": ("irreversible", "suggested from PATCH: an update; review"),
                "post": ("compensable", "suggested from POST: it creates; review"),
            }[method]
            todo = None
            if method == "patch":
                todo = ("an update is undone by writing the old value back: declare a capture "
                        "that reads it ($before), then effect: reversible with a compensation; "
                        "or keep irreversible")
            # a path always starts at a '/': a document's "x{host}" must not extend the host
            route = "/" + str(path).lstrip("/")
            upstream = CommentedMap([("url", base + _template(route, path_params)),
                                     ("method", method.upper())])
            description = op.get("summary") or op.get("description")
            bad = [n for n in path_params if not _ARG_NAME.fullmatch(n)]
            if bad:
                notes.append(f"path parameters {bad} are not argument names: rename them in the URL")
            notes += defs.notes
            defs.notes = []
            problems = schema_problems(schema)
            if problems:  # too large, or references that fan out: not an argument schema
                where, why_not = problems[0]
                notes.append(f"its input schema is left out ({where} {why_not}): write "
                             "input_schema by hand")
            t = _Tool(tool_name(source_name, prefix), f"{method.upper()} {path}",
                      str(description).strip() if description else None, schema, effect, why,
                      todo, upstream, notes=notes, keep_schema=not problems)
            if secured or op.get("security"):
                t.auth_todo = ("the API needs credentials: add headers: {Authorization: "
                               "{secretKeyRef: {name: <secret>, key: <key>}}}")
            tools.append(t)
            by_route[(method, str(path).rstrip("/"))] = t
    for t in tools:
        _pair_rest_undo(t, by_route)
    return [_write(t, prefix, f"--from-openapi {source}", mcp=False) for t in tools]


def _pair_rest_undo(t: _Tool, by_route: Mapping[tuple[str, str], _Tool]) -> None:
    """A POST /things is undone by DELETE /things/{id} and read back by GET /things/{id}."""
    if t.effect != "compensable":
        return
    path = t.source_name.split(" ", 1)[1].rstrip("/")
    for (method, route), other in by_route.items():
        match = re.fullmatch(re.escape(path) + r"/\{([^{}/]+)\}", route)
        if match is None or not _ARG_NAME.fullmatch(match.group(1)):
            continue
        if method == "delete" and t.undo is None:
            t.undo, t.undo_map = other.name, {match.group(1): "$result.id"}
        elif method == "get" and t.read_back is None:
            t.read_back = other.name
    if t.undo is None:
        t.effect, t.effect_why = "irreversible", ("suggested from POST, but no DELETE of what it "
                                                  "creates was found; review")
        t.effect_todo = ("name the tool that undoes this one: set effect: compensable and add "
                         "compensation: {tool, argument_map}; or keep irreversible")


# ---- writing ------------------------------------------------------------------------------------

def _write(t: _Tool, prefix: str, command: str, mcp: bool) -> Draft:
    todos: list[str] = []
    m = CommentedMap()
    m.yaml_set_start_comment(  # source text in a comment is escaped (scaffold_yaml.py)
        f"Draft written by `unwind manifests scaffold {escaped(command)}` from "
        f"{escaped(t.source_name)}.\n"
        "Review each value marked 'suggested', resolve each TODO (`unwind lint` lists them),\n"
        "then set lifecycle: approved.")
    m["tool"] = t.name
    if t.description:
        m["description"] = t.description
    m["effect"] = t.effect
    m.yaml_add_eol_comment(t.effect_why, "effect")
    if t.effect_todo:
        m.yaml_set_comment_before_after_key("effect", before="TODO: " + t.effect_todo, indent=0)
        todos.append("effect: " + t.effect_todo)
    m["permission"] = _permission(prefix, t.effect)
    m.yaml_add_eol_comment("suggested; review", "permission")
    m["lifecycle"] = "draft"
    m["schema_hash"] = schema_hash_of(t.schema)
    if not mcp and t.keep_schema and "input_schema" in ToolManifest.model_fields:
        m["input_schema"] = t.schema
    m["upstream"] = t.upstream
    if t.auth_todo:
        m.yaml_set_comment_before_after_key("upstream", before="TODO: " + t.auth_todo, indent=0)
        todos.append("upstream: " + t.auth_todo)
    if t.effect == "compensable" and t.undo is not None:
        c = CommentedMap()
        c["tool"] = t.undo
        c["argument_map"] = CommentedMap(t.undo_map)
        undo_todo = (f"check that {escaped(t.undo)} undoes this call and that each argument is read "
                     "from the right place ($args: the call's arguments, $result: its answer)")
        c["residue"] = []
        residue_todo = ("list what a rollback leaves behind (an e-mail sent, an id used up), or "
                        "set kind: inverse and effect: reversible if nothing remains")
        c.yaml_set_comment_before_after_key("residue", before="TODO: " + residue_todo, indent=2)
        verify = (f"add verification: {{tool: {escaped(t.read_back or '')}, arguments: {{...}}, "
                  "absent: true} "
                  "so a rollback is read back" if t.read_back else
                  "add verification: a read-only tool that reads the thing back, with expect or "
                  "absent, so a rollback is read back")
        m["compensation"] = c
        m.yaml_set_comment_before_after_key(
            "compensation", before="TODO: " + undo_todo + "\nTODO: " + verify, indent=0)
        todos += ["compensation: " + undo_todo, "compensation: " + verify,
                  "compensation.residue: " + residue_todo]
    text = dump(m)
    data = plain(m)
    problem = draft_problem(text, data)
    if problem is not None:  # a bug of the scaffold's, or a source it cannot write safely
        raise ScaffoldError(f"the draft of {escaped(t.name)} would not read back as written "
                            f"({problem}): nothing written")
    return Draft(t.name, _filename(t.name), text, todos, t.notes, data)


def _filename(tool: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", tool).strip("._") + ".yaml"
