"""`unwind`: validate, lint and test manifests offline; manage a registry; run the operator.

Installed as `kubectl-unwind` too: `kubectl unwind approve|deny|history|diff|status`
decide on and inspect ToolManifest versions in a cluster (plugin_cmds.py).

Every command returns an exit code; errors are one line on stderr, never a traceback
(``main`` turns an unexpected exception into one line too, with the option to see more
via UNWIND_DEBUG=1).
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from .. import __version__
from . import check_cmds, completion
from .check_cmds import cmd_validate as cmd_validate  # kept importable from here
from .output import MACHINE, emit, error_document, wanted_format


def cmd_crds(args: argparse.Namespace) -> int:
    from ..api.crd import write_crds

    outs = [Path(p) for p in (args.out or ["crds", "charts/unwind/crds"])]
    for path in write_crds(outs):
        print(f"wrote {path}")
    return 0


class Parser(argparse.ArgumentParser):
    """argparse, with usage errors that help: the usage of the command that was meant (not
    of `unwind` as a whole), a "did you mean" for a misspelled command, and, when a machine
    format was asked for, the error as the one JSON document on stdout too."""

    def error(self, message: str) -> NoReturn:
        if "invalid choice" in message:
            word = message.split("'")[1] if message.count("'") >= 2 else ""
            choices = [c for a in self._actions if isinstance(a, argparse._SubParsersAction)
                       for c in a.choices]
            close = difflib.get_close_matches(word, choices, n=1)
            if close:
                message += f"; did you mean {close[0]!r}?"
        fmt = wanted_format(sys.argv[1:] if _ARGV is None else _ARGV)
        if fmt in MACHINE:
            emit(error_document("usage", message, command=self.prog,
                                usage=self.format_usage().strip()), fmt)
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


_ARGV: list[str] | None = None  # the command line main() parses, for Parser.error


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)parser of the command given, however deep (`unwind manifests publish`)."""
    while True:
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        name = getattr(args, sub.dest, None) if sub is not None else None
        if sub is None or name not in sub.choices:
            return parser
        parser = sub.choices[name]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    parser = Parser(prog="unwind", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"unwind {__version__}")
    sub: Any = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check_cmds.register(sub)
    completion.register(sub)

    p = sub.add_parser("crds", help="write the CRDs generated from the models")
    p.add_argument("--out", action="append", help="output folder (repeatable; default crds/ and "
                   "charts/unwind/crds/)")
    p.set_defaults(func=cmd_crds)

    _register_optional(sub, command if command in _MODULE_COMMANDS else None)
    return parser


# Commands that live in other modules, imported only when needed, so that `unwind operator`
# does not carry the editor or the registry client in a long-running process.
# The kubectl plugin's commands (plugin_cmds.COMMANDS) are listed here too, so that
# looking them up imports no module.
PLUGIN_COMMANDS = ("approve", "deny", "history", "diff", "status")
_MODULE_COMMANDS = {"keygen": ("registry_cmds",), "manifests": ("registry_cmds", "edit_cmds"),
                    "operator": ("cluster_cmds",), "dev": ("cluster_cmds",),
                    **{c: ("plugin_cmds",) for c in PLUGIN_COMMANDS}}


def _register_optional(sub: argparse._SubParsersAction[argparse.ArgumentParser],
                       command: str | None = None) -> None:
    """Register the commands of other modules: only the one for ``command`` when given."""
    import importlib

    wanted = {m for c, ms in _MODULE_COMMANDS.items() if command in (None, c) for m in ms}
    modules = {m: importlib.import_module(f"{__package__}.{m}") for m in sorted(wanted)}
    if "registry_cmds" in modules:
        modules["registry_cmds"].register_keygen(sub)
    if "registry_cmds" in modules or "edit_cmds" in modules:
        manifests = sub.add_parser("manifests", help="registry and editing commands")
        msub = manifests.add_subparsers(dest="manifests_command", required=True, metavar="COMMAND")
        for name in ("registry_cmds", "edit_cmds"):
            if name in modules:
                register = getattr(modules[name], "register_manifests", None) or modules[name].register
                register(msub)
    if "cluster_cmds" in modules:
        modules["cluster_cmds"].register(sub)
    if "plugin_cmds" in modules:
        modules["plugin_cmds"].register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    global _ARGV
    from .kubectl import hoist_kube_flags

    # `kubectl unwind -n NS status` hands the plugin `-n NS status`: accept kubectl's
    # connection flags before a plugin command too.
    argv = hoist_kube_flags(list(sys.argv[1:] if argv is None else argv), PLUGIN_COMMANDS)
    _ARGV = argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the command's own parser, with its usage
        _chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a last resort: one line, not a traceback
        if os.environ.get("UNWIND_DEBUG"):
            raise
        from .output import fail

        return fail(args, "internal", f"{type(exc).__name__}: {exc} (set UNWIND_DEBUG=1 for details)")
    return code


if __name__ == "__main__":
    sys.exit(main())
