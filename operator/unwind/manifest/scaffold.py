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

import io
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from .lint import schema_hash_of
from .model import TOOL_NAME_PATTERN, ToolManifest

_TOOL_NAME = re.compile(TOOL_NAME_PATTERN)
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.:/-]+")
_PATH_PARAM = re.compile(r"\{([^{}]+)\}")
_ARG_NAME = re.compile(r"[A-Za-z0-9_-]+")
_METHODS = ("get", "put", "post", "patch", "delete")
_UNDO_WORDS = {"create": ("delete", "remove"), "add": ("remove", "delete"),
               "insert": ("delete", "remove"), "open": ("close",), "start": ("stop", "cancel")}
_MAX_REF_DEPTH = 32


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


def from_mcp(tools: Sequence[Mapping[str, Any]], url: str, prefix: str = "") -> list[Draft]:
    """Drafts for each tool of an MCP ``tools/list`` (each a mapping with ``name``,
    ``description``, ``inputSchema``, ``annotations``, as the protocol writes them)."""
    parsed: list[_Tool] = []
    for raw in tools:
        source_name = str(raw.get("name") or "")
        if not source_name:
            continue
        schema = raw.get("inputSchema")
        schema = dict(schema) if isinstance(schema, Mapping) else {"type": "object"}
        annotations = raw.get("annotations")
        effect, why, todo = _mcp_effect(annotations if isinstance(annotations, Mapping) else {})
        upstream = CommentedMap()
        upstream["mcp"] = CommentedMap([("url", url), ("tool", source_name)])
        description = raw.get("description")
        parsed.append(_Tool(tool_name(source_name, prefix), source_name,
                            str(description).strip() if description else None, schema, effect,
                            why, todo, upstream))
    _pair_undos(parsed)
    return [_write(t, prefix, f"--from-mcp {url}", mcp=True) for t in parsed]


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

def _resolve(doc: Mapping[str, Any], node: Any, depth: int = 0) -> Any:
    """``node`` with local ``$ref``s (``#/components/...``) replaced by what they point at."""
    if depth > _MAX_REF_DEPTH:
        return {}
    if isinstance(node, Mapping):
        ref = node.get("$ref")
        if isinstance(ref, str):
            if not ref.startswith("#/"):
                return {}  # a remote reference: left opaque
            target: Any = doc
            for part in ref[2:].split("/"):
                part = part.replace("~1", "/").replace("~0", "~")
                target = target.get(part) if isinstance(target, Mapping) else None
            return _resolve(doc, target, depth + 1) if target is not None else {}
        return {k: _resolve(doc, v, depth + 1) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(doc, v, depth + 1) for v in node]
    return node


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


def _input_schema(doc: Mapping[str, Any], op: Mapping[str, Any],
                  shared: Sequence[Any]) -> tuple[dict[str, Any], list[str], list[str]]:
    """(the operation's input schema, its path parameters, notes) from its parameters and
    its JSON request body."""
    props: dict[str, Any] = {}
    required: list[str] = []
    path_params: list[str] = []
    notes: list[str] = []
    params = [*shared, *(op.get("parameters") or [])]
    for raw in params:
        p = _resolve(doc, raw)
        if not isinstance(p, Mapping) or not isinstance(p.get("name"), str):
            continue
        where, name = p.get("in"), p["name"]
        if where not in ("path", "query"):
            notes.append(f"{where} parameter {name!r} left out (set it in upstream.headers)")
            continue
        props[name] = dict(p.get("schema") or {})
        if p.get("description"):
            props[name].setdefault("description", str(p["description"]))
        if where == "path":
            path_params.append(name)
        if p.get("required") or where == "path":
            required.append(name)
    body = _resolve(doc, op.get("requestBody") or {})
    content = body.get("content") if isinstance(body, Mapping) else None
    json_body = content.get("application/json") if isinstance(content, Mapping) else None
    schema = json_body.get("schema") if isinstance(json_body, Mapping) else None
    if isinstance(schema, Mapping):
        body_props = schema.get("properties")
        if isinstance(body_props, Mapping):
            props.update({str(k): v for k, v in body_props.items()})
            required += [str(n) for n in schema.get("required") or [] if str(n) not in required]
        else:
            notes.append("the JSON body is not an object with properties: its schema is left out")
    out: dict[str, Any] = {"type": "object", "properties": props}
    if required:
        out["required"] = required
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
    secured = bool(doc.get("security")) or bool((doc.get("components") or {}).get("securitySchemes"))
    tools: list[_Tool] = []
    by_route: dict[tuple[str, str], _Tool] = {}
    for path, item in doc["paths"].items():
        if not isinstance(item, Mapping):
            continue
        shared = item.get("parameters") or []
        for method in _METHODS:
            op = item.get(method)
            if not isinstance(op, Mapping):
                continue
            schema, path_params, notes = _input_schema(doc, op, shared)
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
            t = _Tool(tool_name(source_name, prefix), f"{method.upper()} {path}",
                      str(description).strip() if description else None, schema, effect, why,
                      todo, upstream, notes=notes)
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
    m.yaml_set_start_comment(
        f"Draft written by `unwind manifests scaffold {command}` from {t.source_name}.\n"
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
    if not mcp and "input_schema" in ToolManifest.model_fields:
        m["input_schema"] = t.schema
    m["upstream"] = t.upstream
    if t.auth_todo:
        m.yaml_set_comment_before_after_key("upstream", before="TODO: " + t.auth_todo, indent=0)
        todos.append("upstream: " + t.auth_todo)
    if t.effect == "compensable" and t.undo is not None:
        c = CommentedMap()
        c["tool"] = t.undo
        c["argument_map"] = CommentedMap(t.undo_map)
        undo_todo = (f"check that {t.undo} undoes this call and that each argument is read "
                     "from the right place ($args: the call's arguments, $result: its answer)")
        c["residue"] = []
        residue_todo = ("list what a rollback leaves behind (an e-mail sent, an id used up), or "
                        "set kind: inverse and effect: reversible if nothing remains")
        c.yaml_set_comment_before_after_key("residue", before="TODO: " + residue_todo, indent=2)
        verify = (f"add verification: {{tool: {t.read_back}, arguments: {{...}}, absent: true}} "
                  "so a rollback is read back" if t.read_back else
                  "add verification: a read-only tool that reads the thing back, with expect or "
                  "absent, so a rollback is read back")
        m["compensation"] = c
        m.yaml_set_comment_before_after_key(
            "compensation", before="TODO: " + undo_todo + "\nTODO: " + verify, indent=0)
        todos += ["compensation: " + undo_todo, "compensation: " + verify,
                  "compensation.residue: " + residue_todo]
    buffer = io.StringIO()
    yaml = YAML()
    yaml.width = 100
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.dump(m, buffer)
    return Draft(t.name, _filename(t.name), buffer.getvalue(), todos, t.notes)


def _filename(tool: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", tool).strip("._") + ".yaml"
