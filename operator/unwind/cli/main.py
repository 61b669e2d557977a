"""`unwind`: validate, lint and test manifests offline; manage a registry; run the operator.

Installed as `kubectl-unwind` too: `kubectl unwind approve|deny|history|diff|status`
decide on and inspect ToolManifest versions in a cluster (plugin_cmds.py).

Where the commands are: this module builds the parser (and runs `crds`, and `completion`,
which needs the parser whole); each family of commands registers its own in a module of
its own: check_cmds.py (validate, check, lint, test, schema, init), registry_cmds.py and
edit_cmds.py (keygen, manifests ...), cluster_cmds.py (operator, dev, probe,
rotate-signing-key), gateway_cmds.py (gateway, gateway-quit), rollback_cmds.py (plan,
rollback, undo-step, ledger; its list and show in ledger_cmds.py), plugin_cmds.py (approve, deny, history, diff, status, and
plan/rollback of ledger/NAME) and settle_cmds.py (settle, in a cluster and locally). The helpers they use (output.py, usage.py, kubectl.py,
plans.py, plugin_view.py, reports.py, scaffold.py, completion.py) import no command module.
Imports go one way only: tests/cli/test_cli_layers.py fails on a cycle.

Every command returns an exit code; errors are one line on stderr, never a traceback
(``main`` turns an unexpected exception into one line too, with the option to see more
via UNWIND_DEBUG=1).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from . import check_cmds, usage
from .check_cmds import cmd_validate as cmd_validate  # kept importable from here


def cmd_crds(args: argparse.Namespace) -> int:
    from ..api.crd import write_crds

    outs = [Path(p) for p in (args.out or ["crds", "charts/unwind/crds"])]
    for path in write_crds(outs):
        print(f"wrote {path}")
    return 0


def cmd_completion(args: argparse.Namespace) -> int:
    from .completion import bash_script

    print(bash_script(build_parser()), end="")
    return 0


PLUGIN_HELP = ("`kubectl unwind`: decide on and inspect ToolManifest versions, approve calls "
               "waiting in a run's ledger, and plan or roll back a run, in a cluster")
PLUGIN_EPILOG = ("The other `unwind` commands work here too (validate, lint, test, gateway...); "
                 "`unwind --help` lists them.")


def plugin_mode(argv0: str) -> bool:
    """Run as kubectl's plugin (the `kubectl-unwind` executable kubectl found on PATH)."""
    return Path(argv0).name.startswith("kubectl-unwind")


def build_parser(command: str | None = None, plugin: bool = False) -> argparse.ArgumentParser:
    """`unwind`'s parser; as kubectl's plugin its help lists only the plugin's commands (the
    others, such as `operator` or `undo-step`, still run: they are only not listed)."""
    parser = usage.Parser(prog="kubectl unwind" if plugin else "unwind",
                          description=PLUGIN_HELP if plugin else (__doc__.splitlines()[0] if __doc__ else None),
                          epilog=PLUGIN_EPILOG if plugin else None)
    parser.add_argument("--version", action="version", version=f"unwind {__version__}")
    sub: Any = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check_cmds.register(sub)

    p = sub.add_parser("completion", help="print a shell completion script (bash)",
                       description="Print a bash completion script: source <(unwind completion bash)")
    p.add_argument("shell", choices=["bash"])
    p.set_defaults(func=cmd_completion)

    p = sub.add_parser("crds", help="write the CRDs generated from the models")
    p.add_argument("--out", action="append", help="output folder (repeatable; default crds/ and "
                   "charts/unwind/crds/)")
    p.set_defaults(func=cmd_crds)

    _register_optional(sub, command if command in _MODULE_COMMANDS else None)
    if plugin:
        sub._choices_actions[:] = [a for a in sub._choices_actions if a.dest in PLUGIN_LISTED]
    return parser


# Commands that live in other modules, imported only when needed, so that `unwind operator`
# does not carry the editor or the registry client in a long-running process.
# The kubectl plugin's commands (plugin_cmds.COMMANDS) are listed here too, so that
# looking them up imports no module.
PLUGIN_COMMANDS = ("approve", "deny", "history", "diff", "status")
# Commands that take kubectl's flags before them too (plan and rollback of ledger/NAME).
HOISTED = (*PLUGIN_COMMANDS, "plan", "rollback", "settle")
# What `kubectl unwind --help` lists: the commands that act on a cluster through kubectl.
PLUGIN_LISTED = (*HOISTED, "ledger")
_MODULE_COMMANDS = {"keygen": ("registry_cmds",), "manifests": ("registry_cmds", "edit_cmds"),
                    "operator": ("cluster_cmds",), "dev": ("cluster_cmds",),
                    "rotate-signing-key": ("cluster_cmds",), "probe": ("cluster_cmds",),
                    "gateway": ("gateway_cmds",), "gateway-quit": ("gateway_cmds",),
                    **{c: ("rollback_cmds",) for c in ("plan", "rollback", "undo-step", "ledger")},
                    **{c: ("plugin_cmds",) for c in PLUGIN_COMMANDS},
                    "settle": ("settle_cmds",)}


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
    if "settle_cmds" in modules:
        modules["settle_cmds"].register(sub)
    if "gateway_cmds" in modules:
        modules["gateway_cmds"].register(sub)
    if "rollback_cmds" in modules:
        modules["rollback_cmds"].register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    from .kubectl import hoist_kube_flags

    # `kubectl unwind -n NS status` hands the plugin `-n NS status`: accept kubectl's
    # connection flags before a plugin command too.
    argv = hoist_kube_flags(list(sys.argv[1:] if argv is None else argv), HOISTED)
    usage.ARGV[:] = argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command, plugin=plugin_mode(sys.argv[0]))
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the command's own parser, with its usage
        usage.chosen(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
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
