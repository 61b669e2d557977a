"""Reading a worked example out of a docs page, so that the test runs what the page shows
(not a copy beside it that can drift): a section by its heading, its fenced blocks, and
the shell blocks run as a reader runs them (bash -e, unwind on the PATH)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def section(page: str, heading: str) -> str:
    """The text under ``heading`` (written with its #s) of docs/``page``, up to the next
    heading of the same level or above. The heading must be there exactly once."""
    lines = (ROOT / "docs" / page).read_text().splitlines(keepends=True)
    assert lines.count(heading + "\n") == 1, f"one section {heading!r} in docs/{page}"
    level = len(heading) - len(heading.lstrip("#"))
    body, fenced = [], False
    for line in lines[lines.index(heading + "\n") + 1:]:
        fenced ^= line.startswith("```")  # a shell comment in a block is not a heading
        if not fenced and re.match(rf"#{{1,{level}}} ", line):
            break
        body.append(line)
    return "".join(body)


def blocks(text: str, fence: str) -> list[str]:
    """The fenced blocks of one kind (``yaml``, ``sh``) in ``text``, in order."""
    return re.findall(rf"^```{fence}\n(.*?)^```", text, flags=re.M | re.S)


def reader_env() -> dict[str, str]:
    """The environment of a reader who installed unwind: its scripts first on the PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": f"{ROOT / 'operator'}{os.pathsep}{ROOT}"}


def run_shell(script: str, cwd: Path, timeout: float = 240) -> str:
    """Run a docs shell block as written (``bash -e``) in ``cwd``; its output, stdout and
    stderr together. It must succeed; whatever it left running (``... &``) is stopped.
    The output goes to a file, not a pipe: a server the block started in the background
    keeps a pipe open, so a block that fails half-way would otherwise be waited on until
    the timeout."""
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=cwd, env=reader_env(),
                                stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):  # what the block left behind
                os.killpg(proc.pid, signal.SIGTERM)
        log.seek(0)
        out = log.read()
    assert proc.returncode == 0, out
    return out
