"""Local mode runs the cluster's example manifests against a server on this machine:
``unwind gateway --rewrite-upstream FROM=TO`` moves every upstream URL that starts with FROM."""

from __future__ import annotations

from pathlib import Path

import pytest

from unwind.cli.gateway_cmds import _rewrite, _SetupError
from unwind.gateway.catalogue import LocalCatalogue
from unwind.manifest.model import ToolManifest
from unwind.manifest.rewrite import rewrite_upstream

ROOT = Path(__file__).resolve().parents[2]


def manifest(upstream: dict[str, object]) -> ToolManifest:
    return ToolManifest.model_validate({"tool": "t.read", "effect": "read_only", "permission": "p:read",
                                        "upstream": upstream})


def test_a_url_under_from_moves_to_to_and_others_stay() -> None:
    moves = [("http://10.0.0.88:8788", "http://127.0.0.1:9999")]
    moved = rewrite_upstream(manifest({"url": "http://10.0.0.88:8788/issues/{{args.n}}", "method": "GET"}), moves)
    assert moved.upstream.url == "http://127.0.0.1:9999/issues/{{args.n}}"
    kept = rewrite_upstream(manifest({"url": "https://api.example.test/x"}), moves)
    assert kept.upstream.url == "https://api.example.test/x"
    mcp = rewrite_upstream(manifest({"mcp": {"url": "http://10.0.0.88:8788/mcp", "tool": "read"}}), moves)
    assert mcp.upstream.mcp.url == "http://127.0.0.1:9999/mcp"


def test_the_example_manifests_all_move_to_the_local_upstream() -> None:
    catalogue = LocalCatalogue([ROOT / "manifests"], rewrite=[("http://10.0.0.88:8788", "http://127.0.0.1:8788")])
    assert catalogue.ready, catalogue.problem
    urls = [s.manifest.upstream.url for s in catalogue.tools() if s.manifest.upstream]
    assert urls and all(u.startswith("http://127.0.0.1:8788/") for u in urls)


@pytest.mark.parametrize("text", ["http://a", "a=b", "http://a=", "=http://b", "ftp://a=http://b"])
def test_a_rewrite_that_is_not_two_url_prefixes_is_refused_saying_the_form(text: str) -> None:
    with pytest.raises(_SetupError, match="give FROM=TO"):
        _rewrite(text)
