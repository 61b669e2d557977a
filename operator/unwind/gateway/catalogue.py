"""Where the enforced manifests come from.

A ``Catalogue`` gives the manifests by tool and a label for what is loaded (its
generation), and says whether it is ready. ``LocalCatalogue`` reads plain manifest files
(local mode). A pod's catalogue (``bundle_catalogue.BundleCatalogue``) reads the signed
namespace bundle through the API and verifies it; it plugs in here without touching
enforcement. ``start`` runs before the gateway serves (a first load, a poller) and
``aclose`` when it stops.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..manifest.canonical import checksum
from ..manifest.loader import check_paths
from ..manifest.mcp_names import collision_message, name_collisions
from ..manifest.model import ToolManifest
from ..manifest.rewrite import rewrite_upstream

log = logging.getLogger("unwind.gateway")


@dataclass(frozen=True)
class Served:
    """One manifest as enforced: the model, its checksum and its version."""

    manifest: ToolManifest
    checksum: str
    version: int


class Catalogue(Protocol):
    @property
    def ready(self) -> bool: ...

    @property
    def problem(self) -> str | None:
        """Why the catalogue is not ready (or what its last reload refused)."""
        ...

    @property
    def generation(self) -> str: ...

    @property
    def observe(self) -> bool:
        """Observe mode (a rollout): policy violations are recorded, not refused."""
        ...

    def get(self, tool: str) -> Served | None: ...

    def tools(self) -> list[Served]: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


class LocalCatalogue:
    """Plain manifest files, validated as a set, unsigned. A set with any error is not
    served at all (a partial set could drop the undo tool another manifest names)."""

    def __init__(self, paths: Sequence[str | os.PathLike[str]], observe: bool = False,
                 rewrite: Sequence[tuple[str, str]] = ()) -> None:
        self.paths = [str(p) for p in paths]
        self._observe = observe
        self._rewrite = tuple(rewrite)
        self._by_tool: dict[str, Served] = {}
        self._problem: str | None = None
        self._generation = "none"
        self.load()

    def load(self) -> None:
        result = check_paths(self.paths, one_set=True)
        where = ", ".join(self.paths)
        if not result.ok:
            self._by_tool, self._generation = {}, "none"
            first = "; ".join(str(i) for i in result.issues[:3])
            more = f" (and {len(result.issues) - 3} more)" if len(result.issues) > 3 else ""
            self._problem = f"the manifests in {where} are not valid: {first}{more}"
            log.error("catalogue refused: %s", self._problem)
            return
        if not result.manifests:
            self._by_tool, self._generation = {}, "none"
            self._problem = f"no manifests found in {where}"
            log.error("catalogue refused: %s", self._problem)
            return
        collisions = name_collisions(m.tool for m in result.manifests)
        if collisions:
            self._by_tool, self._generation = {}, "none"
            self._problem = f"the manifests in {where} are not valid: {collision_message(collisions)}"
            log.error("catalogue refused: %s", self._problem)
            return
        # the version is the file's: only where its calls go moves (--rewrite-upstream)
        self._by_tool = {m.tool: Served(rewrite_upstream(m, self._rewrite), checksum(m), m.version)
                         for m in result.manifests}
        digest = hashlib.sha256("".join(sorted(s.checksum for s in self._by_tool.values()))
                                .encode()).hexdigest()[:12]
        self._generation = f"local-{digest}"
        self._problem = None
        log.warning("serving %d manifests from %s UNSIGNED (local mode): no signature is "
                    "verified; a pod's gateway serves only the signed bundle",
                    len(self._by_tool), where)

    @property
    def ready(self) -> bool:
        return self._problem is None

    @property
    def observe(self) -> bool:
        return self._observe

    @property
    def problem(self) -> str | None:
        return self._problem

    @property
    def generation(self) -> str:
        return self._generation

    def get(self, tool: str) -> Served | None:
        return self._by_tool.get(tool)

    def tools(self) -> list[Served]:
        return sorted(self._by_tool.values(), key=lambda s: s.manifest.tool)

    async def start(self) -> None:
        return None  # loaded in __init__: the files are read once

    async def aclose(self) -> None:
        return None
