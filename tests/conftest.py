"""Shared test setup."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# No per-example deadline: a busy CI machine must not turn a slow example into a failure.
settings.register_profile("unwind", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("unwind")
