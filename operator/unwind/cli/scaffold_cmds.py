"""`unwind manifests scaffold`: draft manifests for every tool of an MCP server (its
streamable HTTP URL, or the stdio command that starts it: ``--from-mcp -- CMD ARGS``, the
argv ``upstream.mcp.command`` takes) or of an OpenAPI document.

Nothing is written unless every draft is right: the drafts validate, none would overwrite
a file, and each file, once written (first under a temporary name), is read back and must
hold exactly its draft: one document, the manifest meant (``manifest/scaffold_yaml.py``).
Only then are the files linked into place, each without replacing anything.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .check_cmds import _Stop, mcp_tools
from .output import add_output_flags, emit, fail, output_format, plural

FORMS = ("--from-mcp http://127.0.0.1:3000/mcp (an MCP server's streamable HTTP URL), or "
         "--from-mcp -- npx -y @modelcontextprotocol/server-memory (the command that starts a "
         "stdio server, as upstream.mcp.command takes it; give the other options before --)")
STDIO_TIMEOUT_S = 120.0  # starting a server may first fetch it (npx -y)


def _read_document(path: str) -> Any:
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _Stop("io", f"{path}: cannot read: {exc}") from exc
    try:
        return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise _Stop("invalid", f"{path}: not JSON or YAML: {str(exc).splitlines()[0]}") from exc


def mcp_source(url: str | None, command: Sequence[str]) -> str | list[str]:
    """The MCP server to read: a URL, or a command's argv; ``_Stop`` saying which forms
    exist for anything else."""
    if command:
        if url:
            raise _Stop("invalid", f"--from-mcp takes a URL or, after --, a command, not both "
                        f"({url!r} and {shlex.join(command)!r}): give {FORMS}")
        return list(command)
    if not url or not url.startswith(("http://", "https://")):
        said = f"{url!r} is neither an http(s) URL nor a command" if url else "no server given"
        raise _Stop("invalid", f"--from-mcp: {said}; give {FORMS}")
    return url


def list_command(command: Sequence[str]) -> list[dict[str, Any]]:
    """Every tool a stdio MCP server lists; its stderr is kept and shown only on failure."""
    from mcp.client.stdio import StdioServerParameters, stdio_client

    label = "command " + shlex.join(command)
    params = StdioServerParameters(command=command[0], args=list(command[1:]))
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as errlog:
        try:
            return mcp_tools(stdio_client(params, errlog=errlog), STDIO_TIMEOUT_S, label=label)
        except _Stop as stop:
            errlog.seek(0)
            said = " | ".join(line.strip() for line in errlog.read().splitlines()[-3:] if line.strip())
            raise _Stop(stop.code, stop.message + (f" (its stderr: {said[:500]})" if said else "")) \
                from None


def _read_back_problem(path: Path, draft: Any) -> str | None:
    """Why the file at ``path`` does not hold exactly ``draft``, or None."""
    from ..manifest.loader import load_text
    from ..manifest.scaffold_yaml import draft_problem

    with open(path, encoding="utf-8", newline="") as handle:  # newline="": \r is seen as \r
        text = handle.read()
    if text != draft.text:
        return "it does not hold the text written"
    problem = draft_problem(text, draft.data)
    if problem is not None:
        return problem
    loaded = load_text(text, str(path))
    if loaded.errors or loaded.skipped or [s.data for s in loaded.items] != [draft.data]:
        return f"unwind reads {len(loaded.items)} manifests from it, not exactly the draft"
    return None


def write_drafts(out: Path, drafts: Sequence[Any]) -> list[Path]:
    """Write every draft or none: each to a temporary file, read back, then linked into
    place (a link never replaces a file). ``_Stop`` when any is not right."""
    out.mkdir(parents=True, exist_ok=True)
    staged: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for d in drafts:
            fd, name = tempfile.mkstemp(prefix=f".{d.filename}.", suffix=".partial", dir=out)
            staged.append((Path(name), out / d.filename))
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
                handle.write(d.text)
                handle.flush()
                os.fsync(handle.fileno())
            problem = _read_back_problem(Path(name), d)
            if problem is not None:
                raise _Stop("internal", f"{out / d.filename}: read back, {problem}: nothing "
                            "written")
        for tmp, final in staged:
            try:
                os.link(tmp, final)
            except FileExistsError:
                raise _Stop("exists", f"{final} appeared while writing: nothing written "
                            "(scaffold never overwrites)") from None
            placed.append(final)
    except BaseException:
        for path in placed:
            with contextlib.suppress(OSError):
                path.unlink()
        raise
    finally:
        for tmp, _ in staged:
            with contextlib.suppress(OSError):
                tmp.unlink()
    return placed


def _drafts(args: argparse.Namespace, skipped: list[str]) -> tuple[list[Any], str]:
    from ..manifest.scaffold import from_mcp, from_openapi

    if args.from_openapi:
        doc = _read_document(args.from_openapi)
        if not isinstance(doc, dict):
            raise _Stop("invalid", f"{args.from_openapi}: not an OpenAPI document (a mapping)")
        return from_openapi(doc, args.base_url, args.prefix or "", args.from_openapi), \
            args.from_openapi
    server = mcp_source(args.from_mcp, args.command or ())
    if isinstance(server, str):
        return from_mcp(mcp_tools(server), server, args.prefix or "", skipped), server
    tools = list_command(server)
    return from_mcp(tools, server, args.prefix or "", skipped), "command " + shlex.join(server)


def cmd_scaffold(args: argparse.Namespace) -> int:
    """Write draft manifests for every tool of an MCP server or an OpenAPI document."""
    from ..manifest.loader import check_texts
    from ..manifest.scaffold import ScaffoldError
    from ..manifest.scaffold_yaml import escaped

    fmt = output_format(args)
    out = Path(args.dir)
    skipped: list[str] = []
    source = args.from_openapi or args.from_mcp or "the MCP server"
    try:
        if args.command and args.from_openapi:
            raise _Stop("invalid", "a command after -- goes with --from-mcp only")
        drafts, source = _drafts(args, skipped)
    except _Stop as stop:
        return fail(args, stop.code, stop.message)
    except ScaffoldError as exc:
        return fail(args, "invalid", f"{source}: {exc}")
    if not drafts:
        extra = f" ({'; '.join(skipped[:3])})" if skipped else ""
        return fail(args, "invalid", f"the source lists no tool that can be adopted: nothing to "
                    f"write{extra}")
    names = [d.filename for d in drafts]
    clash = sorted({n for n in names if names.count(n) > 1})
    existing = [str(out / n) for n in names if (out / n).exists()]
    if clash or existing:
        what = (f"two tools would be written to {', '.join(clash)}" if clash else
                f"{', '.join(existing[:5])} already exist{'s' if len(existing) == 1 else ''}")
        return fail(args, "exists", f"{what}: nothing written (scaffold never overwrites; "
                    "give another --dir or --prefix)")
    issues = check_texts({str(out / d.filename): d.text for d in drafts})
    if issues:  # a bug of scaffold, never the user's: say so rather than write broken drafts
        return fail(args, "internal", "the drafts do not validate, nothing written: "
                    + "; ".join(str(i) for i in issues[:5]))
    try:
        write_drafts(out, drafts)
    except _Stop as stop:
        return fail(args, stop.code, stop.message)
    todos = sum(len(d.todos) for d in drafts)
    if fmt != "text":
        emit({"ok": True, "written": [str(out / d.filename) for d in drafts],
              "tools": [{"tool": d.tool, "file": str(out / d.filename), "todos": d.todos,
                         "notes": d.notes} for d in drafts], "skipped": skipped}, fmt)
        return 0
    for d in drafts:
        extra = f" ({plural(len(d.todos), 'TODO')})" if d.todos else ""
        print(f"wrote {out / d.filename}{extra}")
        for note in d.notes:
            print(f"  note: {escaped(note)}")
    for line in skipped:
        print(f"skipped a tool: {line}")
    print(f"{plural(len(drafts), 'draft manifest')}, {plural(todos, 'TODO')} to resolve. next: "
          f"`unwind lint {out}` lists each TODO (L038); review the suggested effects, then set "
          "lifecycle: approved")
    return 0


def register_scaffold(sub: Any) -> None:
    """`unwind manifests scaffold` (added to the `manifests` group)."""
    p = sub.add_parser("scaffold", help="write draft manifests from an MCP server or an OpenAPI "
                       "document", description="Write one draft manifest (lifecycle: draft) per "
                       "tool: input schema and schema_hash from the source, effects suggested "
                       "from MCP annotations or HTTP methods, URL templates from OpenAPI paths, "
                       "and # TODO comments where a person must decide (unwind lint lists them "
                       "as L038). Never overwrites a file.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--from-mcp", metavar="URL", nargs="?", const="",
                        help="an MCP server: its streamable HTTP URL, or nothing here and its "
                        "stdio command after -- (--from-mcp -- npx -y "
                        "@modelcontextprotocol/server-memory; the drafts name that command)")
    source.add_argument("--from-openapi", metavar="FILE", help="an OpenAPI 3 document (JSON or YAML)")
    p.add_argument("command", nargs="*", metavar="-- CMD ARGS",
                   help="with --from-mcp: the command that starts a stdio MCP server")
    p.add_argument("--dir", default="manifests",
                   help="folder to write <tool>.yaml files to (default manifests)")
    p.add_argument("--prefix", help="put before each tool name, e.g. memory. (also names the "
                   "suggested permissions)")
    p.add_argument("--base-url", help="OpenAPI: the API's URL, when the document's servers do "
                   "not give an absolute one")
    add_output_flags(p)
    p.set_defaults(func=cmd_scaffold)
