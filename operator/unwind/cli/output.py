"""How the offline and registry commands print: text for people, one document for machines.

With ``--json`` or ``-o json|yaml`` (and ``-o junit|sarif`` where offered), standard output
is exactly one document, whatever happens: the command's result, or, when it could not
produce one (a missing file, a refused write, a usage error, a bug), ``{"ok": false,
"error": {"code", "message"}}``. Messages for people then go to standard error only. A
pipeline can always parse stdout and read the exit code; it never has to guess whether an
empty stdout meant success.

Colour is used only when the stream is a terminal and ``NO_COLOR`` is not set, so CI logs
and files stay plain text.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import yaml

MACHINE = ("json", "yaml")


def add_output_flags(p: argparse.ArgumentParser, extra: Sequence[str] = ()) -> None:
    """``-o/--output FORMAT`` (text, json, yaml, plus ``extra``); ``--json``, the older
    spelling of ``-o json``, still works for existing scripts but is not shown in the help."""
    formats = ("text", *MACHINE, *extra)
    p.add_argument("-o", "--output", choices=formats, default=None, metavar="FORMAT",
                   help=f"output format: {', '.join(formats)} (default text)")
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # deprecated: -o json


def output_format(args: argparse.Namespace) -> str:
    """The format asked for: ``-o`` wins over ``--json``; text when neither is given."""
    fmt = getattr(args, "output", None)
    if fmt:
        return str(fmt)
    return "json" if getattr(args, "json", False) else "text"


def machine(args: argparse.Namespace) -> bool:
    return output_format(args) != "text"


def emit(value: Any, fmt: str = "json") -> None:
    """Write one document to stdout as JSON (the default) or YAML."""
    if fmt == "yaml":
        sys.stdout.write(yaml.safe_dump(value, sort_keys=False, allow_unicode=True))
    else:
        sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")


def error_document(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"ok": False, "error": {"code": code, "message": message, **extra}}


def fail(args: argparse.Namespace | None, code: str, message: str, exit_code: int = 1) -> int:
    """Report an error that stops the command: one line on stderr, and in a machine format
    the error document on stdout (the only thing printed there)."""
    print(f"{paint('error:', 'red', sys.stderr)} {message}", file=sys.stderr)
    fmt = output_format(args) if args is not None else "text"
    if fmt in MACHINE:
        emit(error_document(code, message), fmt)
    elif fmt in ("junit", "sarif"):
        from .reports import error_report

        sys.stdout.write(error_report(fmt, code, message))
    return exit_code


def wanted_format(argv: Sequence[str]) -> str:
    """The output format named on a command line that may not parse (for usage errors)."""
    fmt = "text"
    for i, word in enumerate(argv):
        if word == "--json":
            fmt = "json"
        elif word in ("-o", "--output") and i + 1 < len(argv):
            fmt = argv[i + 1]
        elif word.startswith("--output="):
            fmt = word.split("=", 1)[1]
        elif word.startswith("-o") and len(word) > 2 and not word.startswith("--"):
            fmt = word[2:]
    return fmt


_COLOURS = {"red": "31", "green": "32", "yellow": "33", "bold": "1"}


def paint(text: str, colour: str, stream: TextIO | None = None) -> str:
    """``text`` in ``colour`` when ``stream`` (default stdout) is a terminal and NO_COLOR
    is unset; plain otherwise."""
    stream = stream or sys.stdout
    try:
        tty = stream.isatty()
    except (AttributeError, ValueError):
        tty = False
    if not tty or os.environ.get("NO_COLOR") or os.environ.get("TERM") == "dumb":
        return text
    return f"\033[{_COLOURS[colour]}m{text}\033[0m"


def plural(n: int, word: str, many: str | None = None) -> str:
    """``1 tool manifest``, ``2 tool manifests`` (``many`` for irregular plurals)."""
    return f"{n} {word if n == 1 else (many or word + 's')}"


def table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> str:
    """Rows under a header, each column as wide as its widest cell (like kubectl get)."""
    cells = [list(header), *[list(r) for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join("   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
                     for row in cells)
