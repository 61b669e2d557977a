"""Which arguments a tool's input schema declares (issue 29, item 2).

JSON Schema admits properties an object schema does not list unless it says
``additionalProperties: false``. With ``input_schema: {properties: {id, email}}``,
``customers.update_email {id, email, role: admin}`` passed the check and the PATCH made the
customer an admin, and the rollback restored only the email. A reviewed tool must do what
it was reviewed for, so Unwind reads an object schema that lists ``properties`` as
*closed*: an argument it does not list is undeclared, and the gateway refuses the call
(400 ``validation_error`` naming each one; nothing is recorded or sent). It refuses rather
than drops them: dropping would change what the agent asked for without telling it, and
the agent would believe the role had been set.

An object stays open where the schema says so: ``additionalProperties`` or
``unevaluatedProperties`` other than ``false``, ``patternProperties`` (for the names they
match), or no ``properties`` at all (``{type: object}``: a free-form object). Lint warns
(L041) where a mutating tool's schema is open (``open_places``). The walk follows local
``$ref``s and the members of ``allOf``/``anyOf``/``oneOf``/``if``/``then``/``else`` (a name
any member lists is declared), and goes down into declared properties and array items.
Pure; its work is counted against the same budget as the check itself (``schema_work``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .model import ToolManifest
from .refs import RefSyntaxError, parse_ref
from .schema_work import _re2, _spend, target

_MEMBERS = ("allOf", "anyOf", "oneOf")
_BRANCHES = ("if", "then", "else")
_OBJECT_WORDS = ("properties", "additionalProperties", "patternProperties", "required",
                 "unevaluatedProperties")


def _closure(schema: dict[str, Any], nodes: list[Any]) -> list[dict[str, Any]]:
    """The object schemas that apply at one place: ``nodes``, their references and members."""
    seen: set[int] = set()
    out: list[dict[str, Any]] = []
    stack = list(nodes)
    while stack:
        node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        _spend(1)
        out.append(node)
        for key in ("$ref", "$dynamicRef"):
            ref = node.get(key)
            if isinstance(ref, str):
                stack.append(target(schema, ref))
        for key in _MEMBERS:
            if isinstance(node.get(key), list):
                stack.extend(node[key])
        stack.extend(node.get(key) for key in _BRANCHES)
    return out


def _open(node: dict[str, Any]) -> bool:
    return any(key in node and node[key] is not False
               for key in ("additionalProperties", "unevaluatedProperties"))


def _where(path: tuple[Any, ...]) -> str:
    from .input_schema import field_path

    return field_path("arguments", path)


def undeclared(schema: dict[str, Any], arguments: Any) -> list[str]:
    """The field paths of ``arguments`` that ``schema`` does not declare
    (``arguments.role``, ``arguments.items[0].extra``), in the order found."""
    found: list[str] = []
    stack: list[tuple[Any, list[Any], tuple[Any, ...]]] = [(arguments, [schema], ())]
    while stack:
        value, nodes, path = stack.pop()
        applied = _closure(schema, nodes)
        if isinstance(value, dict):
            declared: dict[str, list[Any]] = {}
            patterns: list[tuple[str, Any]] = []
            listed = is_open = False
            for node in applied:
                props = node.get("properties")
                if isinstance(props, dict):
                    listed = True
                    for name, sub in props.items():
                        declared.setdefault(name, []).append(sub)
                if isinstance(node.get("patternProperties"), dict):
                    patterns += list(node["patternProperties"].items())
                is_open = is_open or _open(node)
            for key in reversed(list(value)):
                subs = list(declared.get(key, []))
                subs += [sub for pattern, sub in patterns if _re2(pattern).search(key)]
                if subs:
                    stack.append((value[key], subs, (*path, key)))
                elif listed and not is_open:
                    found.append(_where((*path, key)))
        elif isinstance(value, list):
            for i in reversed(range(len(value))):
                subs = []
                for node in applied:
                    prefix = node.get("prefixItems")
                    if isinstance(prefix, list) and i < len(prefix):
                        subs.append(prefix[i])
                    elif isinstance(node.get("items"), dict):
                        subs.append(node["items"])
                if subs:
                    stack.append((value[i], subs, (*path, i)))
    return sorted(found, key=lambda p: (p.count(".") + p.count("["), p))


def open_places(schema: dict[str, Any]) -> Iterator[str]:
    """Where ``schema`` lets a call send arguments it does not name (schema paths, from
    ``input_schema``), following declared properties and items from the root; each place
    once."""
    from .input_schema import field_path

    seen: set[int] = set()
    stack: list[tuple[Any, tuple[Any, ...]]] = [(schema, ())]
    while stack:
        node, path = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        applied = _closure(schema, [node])
        typed = {t for n in applied for t in ([n["type"]] if isinstance(n.get("type"), str)
                                              else n.get("type") or [])}
        shaped = any(k in n for n in applied for k in _OBJECT_WORDS)
        objects = "object" in typed or (not typed and (shaped or not path))
        listed = any(isinstance(n.get("properties"), dict) for n in applied)
        why = next((k for n in applied for k in ("additionalProperties", "unevaluatedProperties")
                    if k in n and n[k] is not False), None)
        if objects and (why or not listed):
            where = field_path("input_schema", path)
            yield (f"{where}: {why} admits arguments the schema does not name" if why else
                   f"{where}: an object with no properties listed admits any argument")
        for n in applied:
            for name, sub in (n.get("properties") or {}).items():
                stack.append((sub, (*path, "properties", name)))
            if isinstance(n.get("items"), dict):
                stack.append((n["items"], (*path, "items")))


def restore_note(m: ToolManifest) -> str:
    """For an undo that puts values back (it reads ``$before``, or the tool is its own
    inverse): ``"; it restores only ..."`` naming the fields a call may change that the undo
    does not restore, as the tool's ``input_schema`` declares them; "" when it restores
    them all, or when the undo is not a restore (a delete of what was created)."""
    c = m.compensation
    if c is None:
        return ""
    restored: set[str] = set()
    identity: set[str] = set()
    for name, raw in c.argument_map.items():
        try:
            ref = parse_ref(raw)
        except RefSyntaxError:
            return ""
        if ref.root == "args" and ref.path[:1] == (name,):
            identity.add(name)
        elif ref.root == "before" or (c.tool == m.tool and ref.root == "args"):
            restored.add(name)
    if not restored:
        return ""
    only = ", ".join(sorted(restored))
    schema = m.input_schema
    if not isinstance(schema, dict):
        return (f"; it restores only {only}: the tool has no input_schema, so nothing bounds "
                "which other fields a call changed")
    root = _closure(schema, [schema])
    if any(_open(n) for n in root) or not any(isinstance(n.get("properties"), dict)
                                              for n in root):
        return (f"; it restores only {only}: the tool's input_schema admits fields it does not "
                "name, which a call may have changed too")
    fields = {name for n in root for name in (n.get("properties") or {})}
    left = sorted(fields - restored - identity)
    if not left:
        return ""
    return (f"; it restores only {only}: a call may also change {', '.join(left)}, which the "
            "undo leaves as the call set them")
