"""Local Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) on loopback.

Why this exists: tests and ``unwind dev up`` need a real API server without Docker or a
prebuilt download; see docs/controlplane.md. Names are imported lazily so that
``python -m unwind.controlplane.build`` runs its module only once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .build import BinPaths, BuildError, ensure_binaries
    from .cluster import ControlPlane, ControlPlaneError, make_token_kubeconfig, stop_from_dir

_WHERE = {
    "BinPaths": "build", "BuildError": "build", "ensure_binaries": "build",
    "ControlPlane": "cluster", "ControlPlaneError": "cluster",
    "make_token_kubeconfig": "cluster", "stop_from_dir": "cluster",
}

__all__ = [
    "BinPaths",
    "BuildError",
    "ControlPlane",
    "ControlPlaneError",
    "ensure_binaries",
    "make_token_kubeconfig",
    "stop_from_dir",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
