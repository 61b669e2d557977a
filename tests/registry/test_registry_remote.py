"""The remote loader: https (or loopback http) only, certificate checked, few requests."""

from __future__ import annotations

import time
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.registry import (
    FolderStorage,
    HttpStorage,
    MemoryGenerations,
    Registry,
    RegistryError,
    TrustStore,
    load_remote,
)

from .tls import Server, Tls, serve, serve_scripted


def _publish(root: Path, key: Ed25519PrivateKey) -> None:
    registry = Registry(FolderStorage(root))
    registry.publish([{"tool": "github/issues:get", "effect": "read_only", "permission": "p"},
                      {"tool": "b.c", "effect": "read_only", "permission": "p"}],
                     by="alice", key=key)
    registry.approve("github/issues:get", by="bob", key=key)
    registry.publish([{"tool": "github/issues:get", "effect": "read_only", "permission": "q"}],
                     by="alice", key=key)


def test_only_the_index_and_each_enforced_version_are_fetched(
        https_server: Server, tls: Tls, signing_keys: dict[str, Ed25519PrivateKey]) -> None:
    root = https_server.root / "few-requests"
    _publish(root, signing_keys["k1"])
    before = len(https_server.requested)
    loaded = load_remote(f"{https_server.base_url}/few-requests/", TrustStore(
        [signing_keys["k1"].public_key()]), ca_file=tls.ca_file)
    assert {t: m.version for t, m in loaded.items()} == {"github/issues:get": 2}
    assert https_server.requested[before:] == [
        "/few-requests/index.json", "/few-requests/tools/github%252Fissues%253Aget/v2.json"]


def test_a_server_whose_certificate_is_not_from_the_given_ca_is_refused(
        https_server: Server, tmp_path: Path) -> None:
    other_ca = tmp_path / "other.pem"
    from .tls import make_tls
    other_ca.write_bytes(make_tls(tmp_path).ca_file.read_bytes())
    with pytest.raises(RegistryError, match="CERTIFICATE_VERIFY_FAILED") as err:
        load_remote(f"{https_server.base_url}/x", ca_file=other_ca)
    assert err.value.code == "remote"


@pytest.mark.parametrize("url", ["http://10.0.0.5/reg", "http://example.invalid/reg",
                                 "ftp://127.0.0.1/reg", "reg"])
def test_plain_http_to_another_host_and_other_schemes_are_refused(url: str) -> None:
    with pytest.raises(RegistryError) as err:
        load_remote(url)
    assert err.value.code == "remote" and url in err.value.message


def test_plain_http_on_loopback_is_allowed(tmp_path: Path,
                                           signing_keys: dict[str, Ed25519PrivateKey]) -> None:
    _publish(tmp_path / "reg", signing_keys["k1"])
    with serve(tmp_path, None) as server:
        assert set(load_remote(f"{server.base_url}/reg")) == {"github/issues:get"}


def test_a_missing_registry_is_reported_with_its_url(https_server: Server, tls: Tls) -> None:
    with pytest.raises(RegistryError, match=r"no registry at .*/absent/index\.json") as err:
        load_remote(f"{https_server.base_url}/absent", ca_file=tls.ca_file)
    assert err.value.code == "not_found"


def test_a_remote_registry_is_read_only(https_server: Server, tls: Tls) -> None:
    registry = Registry(FolderStorage(https_server.root / "ro"))
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "p"}], by="x")
    remote = Registry(HttpStorage(f"{https_server.base_url}/ro", ca_file=tls.ca_file))
    with pytest.raises(RegistryError, match="read-only"):
        remote.approve("a", by="y")


# ---- redirects, deadlines and sizes ----------------------------------------------------

def _ca(tls: Tls) -> dict[str, Any]:
    return {"ca_file": tls.ca_file}


def test_an_https_registry_that_redirects_to_plain_http_is_refused(
        tmp_path: Path, tls: Tls, signing_keys: dict[str, Ed25519PrivateKey]) -> None:
    _publish(tmp_path / "reg", signing_keys["k1"])
    with serve(tmp_path, None) as plain:
        def redirect(h: BaseHTTPRequestHandler) -> None:
            h.send_response(302)
            h.send_header("Location", f"{plain.base_url}{h.path}")
            h.send_header("Content-Length", "0")
            h.end_headers()

        with serve_scripted(redirect, tls) as https, pytest.raises(RegistryError) as err:
            load_remote(f"{https.base_url}/reg", **_ca(tls))
    assert err.value.code == "remote"
    assert "HTTP 302" in err.value.message and "redirect" in err.value.message
    assert f"{plain.base_url}/reg/index.json" in err.value.message
    assert plain.requested == []  # the plain-http address was never asked


def _trickle(h: BaseHTTPRequestHandler) -> None:
    """Headers at once, then one byte every 0.2 s (at most 40, so the server stops)."""
    h.send_response(200)
    h.send_header("Content-Length", "1000")
    h.end_headers()
    try:
        for _ in range(40):
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(0.2)
    except OSError:
        pass  # the client hung up: what a deadline should make it do


def test_a_server_that_trickles_one_byte_at_a_time_fails_at_the_fetch_deadline(tls: Tls) -> None:
    with serve_scripted(_trickle, tls) as server:
        storage = HttpStorage(f"{server.base_url}/reg", timeout=1.0, **_ca(tls))
        start = time.monotonic()
        with pytest.raises(RegistryError) as err:
            storage.read_index()
        elapsed = time.monotonic() - start
    assert err.value.code == "remote" and "deadline" in err.value.message
    assert "1 s" in err.value.message and "/reg/index.json" in err.value.message
    # Each byte comes well within a per-read timeout, so only a deadline over the whole
    # fetch stops it; 40 bytes would take 8 s.
    assert elapsed < 4.0


def test_a_whole_load_has_its_own_deadline_even_when_each_fetch_is_quick_enough(
        tmp_path: Path, tls: Tls) -> None:
    registry = Registry(FolderStorage(tmp_path / "reg"))
    registry.publish([{"tool": f"t{i}", "effect": "read_only", "permission": "p"} for i in range(4)],
                     by="alice", status="approved")

    def slow(h: BaseHTTPRequestHandler) -> None:
        time.sleep(0.4)
        assert isinstance(h, SimpleHTTPRequestHandler)
        f = h.send_head()
        if f is not None:
            with f:
                h.copyfile(f, h.wfile)

    with serve_scripted(slow, tls, root=tmp_path) as server, pytest.raises(RegistryError) as err:
        load_remote(f"{server.base_url}/reg", timeout=1.0, total_timeout=1.0, **_ca(tls))
    assert err.value.code == "remote" and "whole load" in err.value.message


def test_a_file_announced_larger_than_the_limit_is_refused_before_it_is_read(tls: Tls) -> None:
    def huge(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(5 * 1024 * 1024))
        h.end_headers()

    with serve_scripted(huge, tls) as server, pytest.raises(RegistryError) as err:
        HttpStorage(f"{server.base_url}/reg", **_ca(tls)).read_index()
    assert err.value.code == "remote" and "4194304 bytes" in err.value.message


def test_a_file_streamed_without_a_length_is_cut_at_the_limit(tls: Tls) -> None:
    def endless(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.end_headers()  # no Content-Length: the body ends when the server closes
        try:
            for _ in range(64):
                h.wfile.write(b"x" * 1024)
        except OSError:
            pass

    with serve_scripted(endless, tls) as server, pytest.raises(RegistryError) as err:
        HttpStorage(f"{server.base_url}/reg", max_bytes=4096, **_ca(tls)).read_index()
    assert err.value.code == "remote" and "larger than 4096 bytes" in err.value.message


def test_a_gateway_reloading_with_its_generations_refuses_an_older_index_served_again(
        https_server: Server, tls: Tls, signing_keys: dict[str, Ed25519PrivateKey]) -> None:
    root = https_server.root / "gateway-replay"
    key = signing_keys["k1"]
    registry = Registry(FolderStorage(root))
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "p"}], by="x",
                     status="approved", key=key)
    old = (root / "index.json").read_bytes()
    registry.publish([{"tool": "a", "effect": "read_only", "permission": "q"}], by="x",
                     status="approved", key=key)
    seen = MemoryGenerations()
    trust = TrustStore([key.public_key()])
    url = f"{https_server.base_url}/gateway-replay"
    assert load_remote(url, trust, tls.ca_file, generations=seen)["a"].version == 2
    (root / "index.json").write_bytes(old)
    with pytest.raises(RegistryError) as err:
        load_remote(url, trust, tls.ca_file, generations=seen)
    assert err.value.code == "index_rollback" and "by this process" in err.value.message
    # Without memory only the expiry bounds a replay: the old copy is still signed and fresh.
    assert load_remote(url, trust, tls.ca_file)["a"].version == 1
