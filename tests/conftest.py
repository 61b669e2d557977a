"""Shared test setup."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

# No per-example deadline: a busy CI machine must not turn a slow example into a failure.
settings.register_profile("unwind", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("unwind")


def _current_kubectl_first() -> None:
    """The tests' `kubectl` is the one built with the control plane (Debian's is 1.20)."""
    from unwind.controlplane.build import cached_binaries

    bins = cached_binaries()
    if bins is not None:
        os.environ["PATH"] = f"{bins.kubectl.parent}{os.pathsep}{os.environ.get('PATH', '')}"


_current_kubectl_first()
