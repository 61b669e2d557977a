"""Process helpers for the control plane: start options, liveness, stopping by pid.

Why this exists: components are stopped by the pids we started (never by name), possibly
from another process that only has ``state.json``; these helpers check that a pid is still
the component we started (pid reuse) and stop it with SIGTERM and a SIGKILL fallback.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def die_with_parent(sig: int) -> Callable[[], None]:
    """A preexec_fn making the child get ``sig`` when its parent dies (PR_SET_PDEATHSIG).

    The API server hangs on SIGTERM once etcd is gone, and all children get the signal at
    once, so callers pass SIGKILL for it and SIGTERM for etcd.
    """
    def preexec() -> None:  # runs in the child between fork and exec
        with contextlib.suppress(Exception):
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)
    return preexec


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def pid_is_component(pid: int, name: str, workdir: Path) -> bool:
    """Is pid still the component we started (guards against pid reuse)?"""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(argv) and Path(argv[0].decode(errors="replace")).name == name and \
        str(workdir).encode() in b"\0".join(argv)


def terminate(pid: int, timeout: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM, wait, SIGKILL fallback."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                return
            if proc is None and not pid_alive(pid):
                return
            time.sleep(0.1)
