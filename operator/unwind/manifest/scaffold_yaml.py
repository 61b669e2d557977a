"""Writing a draft manifest's YAML so that whatever a source says stays one value of one
draft (``unwind manifests scaffold``; issue 29, item 1).

A source (an MCP server's ``tools/list``, an OpenAPI document) is input from outside: its
names, descriptions and schemas may hold any character. YAML readers break lines at more
than ``\\n``: every one at ``\\r``, YAML 1.1 readers (PyYAML, and go-yaml under kubectl) at
``\\x85``, ``\\u2028`` and ``\\u2029`` too, and ruamel prefixes ``# `` to a comment's lines at
``\\n`` only, so a tool name holding ``\\r---\\r`` once planted a second, approved manifest in
a draft file. And a plain ``yes`` written by a YAML 1.2 emitter is read back as ``true`` by
a YAML 1.1 reader (``kubectl apply``). So:

- source text in a comment goes through ``escaped``: every character that does not print as
  itself (controls, format characters, line and paragraph separators, surrogates, private
  or unassigned code points) and the backslash are written as escapes;
- ``quoted`` marks every key and value that holds such a character, or that a YAML 1.1
  reader would resolve to something other than a string, to be written double-quoted, the
  style in which the emitter escapes them (``\\r``, ``\\N``, ``\\L``, ``\\P``...);
- ``draft_problem`` reads the text back with both a YAML 1.2 reader (ruamel) and a YAML 1.1
  reader (PyYAML, as ``unwind`` and Kubernetes' tooling read it), and says what is wrong
  unless each gives exactly one document equal to the draft meant, and the text holds none
  of those characters raw. The command writes nothing when any draft fails it, and reads
  each file back once written (``cli/scaffold_cmds.py``).
"""

from __future__ import annotations

import io
import json
import unicodedata
from collections.abc import Mapping
from typing import Any

import yaml as pyyaml
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

# Characters that never print as themselves: Cc (controls, \r and \x85 among them), Cf
# (format: bidi overrides, zero-width), Zl/Zp (\u2028, \u2029), Cs, Co, Cn.
_HIDDEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})
_RESOLVER = pyyaml.resolver.Resolver()


def _hidden(ch: str) -> bool:
    return unicodedata.category(ch) in _HIDDEN


def escaped(text: str) -> str:
    """``text`` for a comment: one line, every hidden character (and ``\\``) as an escape."""
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif _hidden(ch):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else
                       f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)


def _ambiguous(text: str) -> bool:
    """Whether a plain scalar of ``text`` could be read as anything but this string."""
    if not text or text != text.strip() or any(_hidden(ch) for ch in text):
        return True
    # what a YAML 1.1 reader makes of it (yes, on, 1_000, 1:20, 2001-12-14 ...)
    tag = _RESOLVER.resolve(pyyaml.ScalarNode, text, (True, False))  # type: ignore[no-untyped-call]
    return bool(tag != "tag:yaml.org,2002:str")


def _quote(value: Any) -> Any:
    if isinstance(value, str) and _ambiguous(value):
        return DoubleQuotedScalarString(value)
    return quoted(value) if isinstance(value, Mapping | list) else value


def quoted(node: Any) -> Any:
    """``node`` with every ambiguous key and value marked double-quoted. A ``CommentedMap``
    is changed in place (its comments hang on the scaffold's own keys, never ambiguous);
    plain mappings and lists are copied."""
    if isinstance(node, CommentedMap):
        for i, key in enumerate(list(node)):
            if isinstance(key, str) and _ambiguous(key):  # a source's name (an argument's)
                node.insert(i, DoubleQuotedScalarString(key), _quote(node.pop(key)))
            else:
                node[key] = _quote(node[key])
        return node
    if isinstance(node, Mapping):
        return {_quote(k): _quote(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_quote(v) for v in node]
    return node


def dump(m: CommentedMap) -> str:
    buffer = io.StringIO()
    writer = YAML()
    # No folding: ruamel folds a long double-quoted scalar at a space next to an escape and
    # reads it back with a space more (draft_problem caught it); a long line is harmless.
    writer.width = 1 << 20
    writer.indent(mapping=2, sequence=4, offset=2)
    writer.dump(quoted(m), buffer)
    return buffer.getvalue()


def plain(node: Any) -> Any:
    """What a draft means, as JSON values (the mapping a reader must find)."""
    return json.loads(json.dumps(node))


def _raw_break(text: str) -> str | None:
    """A character some YAML reader breaks a line at, or that no emitter writes raw."""
    for i, ch in enumerate(text):
        if ch != "\n" and (unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch == "\ufeff"):
            return f"a raw {ch!r} at offset {i}"
    return None


def draft_problem(text: str, expected: Any) -> str | None:
    """Why ``text`` is not exactly the one draft ``expected`` (plain JSON values) for every
    YAML reader, or None."""
    raw = _raw_break(text)
    if raw is not None:
        return f"the text holds {raw}"
    def ruamel() -> list[Any]:
        return list(YAML(typ="safe", pure=True).load_all(text))

    def pyyaml_() -> list[Any]:
        return list(pyyaml.safe_load_all(text))
    readers = {"YAML 1.2 (ruamel)": ruamel, "YAML 1.1 (PyYAML)": pyyaml_}
    for name, read in readers.items():
        try:
            documents = read()
        except Exception as exc:  # any parse error means the text is not the draft
            return f"a {name} reader cannot read it: {str(exc).splitlines()[0]}"
        if len(documents) != 1:
            return f"a {name} reader finds {len(documents)} documents in it, not 1"
        if documents[0] != expected:
            return f"a {name} reader reads another manifest from it than the one meant"
    return None
