"""Moving where manifests' calls go, for local mode: ``--rewrite-upstream FROM=TO``.

Why this exists: the example manifests name their upstream as pods reach it (a Service
address of the dev cluster); a developer's laptop runs the same files against a server on
127.0.0.1. Only the transport moves: the manifest's version (its checksum) stays the file's,
so a ledger written by a rewriting gateway is planned and rolled back with the same files.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Rewrite = tuple[str, str]


def parse_rewrite(text: str) -> Rewrite:
    """``FROM=TO`` (two http(s) URL prefixes) as a pair; ValueError saying the form."""
    old, sep, new = text.partition("=")
    if not sep or not old.startswith(("http://", "https://")) or not new.startswith(("http://", "https://")):
        raise ValueError(f"--rewrite-upstream {text!r}: give FROM=TO, two URL prefixes, e.g. "
                         "http://10.0.0.88:8788=http://127.0.0.1:8789")
    return old, new


def rewrite_upstream(manifest: Any, rewrite: Sequence[Rewrite]) -> Any:
    """``manifest`` calling TO where its upstream URL (or MCP server URL) starts with FROM,
    for the first matching (FROM, TO)."""
    upstream = manifest.upstream
    if upstream is None or not rewrite:
        return manifest

    def moved(url: str | None) -> str | None:
        for old, new in rewrite:
            if url is not None and url.startswith(old):
                return new + url[len(old):]
        return url

    update: dict[str, Any] = {"url": moved(upstream.url)}
    if upstream.mcp is not None:
        update["mcp"] = upstream.mcp.model_copy(update={"url": moved(upstream.mcp.url)})
    return manifest.model_copy(update={"upstream": upstream.model_copy(update=update)})
