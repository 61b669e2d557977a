"""The remote loader: https (or loopback http) only, certificate checked, few requests."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.registry import FolderStorage, Registry, RegistryError, TrustStore, load_remote

from .tls import Server, Tls, serve


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
    from unwind.registry import HttpStorage
    remote = Registry(HttpStorage(f"{https_server.base_url}/ro", ca_file=tls.ca_file))
    with pytest.raises(RegistryError, match="read-only"):
        remote.approve("a", by="y")
