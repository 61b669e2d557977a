"""Tampering with a registry is refused by load, named by tool and version, and makes
`unwind manifests verify` exit 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.registry import FolderStorage, Registry, RegistryError, TrustStore

from .cli import run

TOOL = "stripe.refund"
FILE = "tools/stripe%2Erefund"


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Ed25519PrivateKey]:
    """A registry with two signed approved versions of one tool, and the trusted key file."""
    key = Ed25519PrivateKey.generate()
    (tmp_path / "trusted.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    registry = Registry(FolderStorage(tmp_path / "reg"))
    for permission in ("payments:refund", "payments:refund-v2"):
        registry.publish([{"tool": TOOL, "effect": "idempotent", "permission": permission}],
                         by="alice", status="approved", key=key)
    return tmp_path, key


def _refused(root: Path, key: Ed25519PrivateKey, version: int) -> RegistryError:
    with pytest.raises(RegistryError) as err:
        Registry(FolderStorage(root / "reg")).load(TrustStore([key.public_key()]))
    assert f"{TOOL} v{version}" in err.value.message
    assert f"{FILE}/v{version}.json" in err.value.message
    return err.value


def _verify_exits_1(root: Path, capsys: pytest.CaptureFixture[str], version: int) -> str:
    code, _, err = run(capsys, "manifests", "verify", "--registry", str(root / "reg"),
                       "--trust", str(root / "trusted.pub"))
    assert code == 1 and f"error: {TOOL} v{version} (" in err
    return err


def _edit(path: Path, change: dict[str, object], manifest: bool = False) -> None:
    record = json.loads(path.read_text())
    (record["manifest"] if manifest else record).update(change)
    path.write_text(json.dumps(record))


def test_editing_a_stored_version_is_refused(signed: tuple[Path, Ed25519PrivateKey],
                                             capsys: pytest.CaptureFixture[str]) -> None:
    root, key = signed
    _edit(root / "reg" / FILE / "v2.json", {"permission": "payments:admin"}, manifest=True)
    assert _refused(root, key, 2).code == "tampered"
    assert "no longer matches its checksum" in _verify_exits_1(root, capsys, 2)


def test_editing_a_version_and_its_checksum_still_fails_the_index_and_signature(
        signed: tuple[Path, Ed25519PrivateKey], capsys: pytest.CaptureFixture[str]) -> None:
    root, key = signed
    path = root / "reg" / FILE / "v2.json"
    record = json.loads(path.read_text())
    record["manifest"]["permission"] = "payments:admin"
    from unwind.manifest.canonical import checksum
    record["checksum"] = checksum(record["manifest"])
    path.write_text(json.dumps(record))
    assert _refused(root, key, 2).code == "tampered"
    assert "differs from the one in index.json" in _verify_exits_1(root, capsys, 2)


def test_swapping_a_signature_between_versions_is_refused(
        signed: tuple[Path, Ed25519PrivateKey], capsys: pytest.CaptureFixture[str]) -> None:
    root, key = signed
    index_path = root / "reg" / "index.json"
    index = json.loads(index_path.read_text())
    first, second = index["tools"][TOOL]
    second["signature"] = first["signature"]
    index_path.write_text(json.dumps(index))
    _edit(root / "reg" / FILE / "v2.json", {"signature": first["signature"]})
    with pytest.raises(RegistryError) as err:  # the index names the versions: it fails first
        Registry(FolderStorage(root / "reg")).load(TrustStore([key.public_key()]))
    assert err.value.code == "bad_index_signature" and "index.json" in err.value.message
    out = _verify_exits_1(root, capsys, 2)
    assert "index.json: the index's signature does not verify" in out
    assert f"{TOOL} v2 ({root / 'reg' / FILE}/v2.json): its signature does not verify" in out


def test_publishing_with_an_untrusted_key_onto_a_signed_registry_is_refused(
        signed: tuple[Path, Ed25519PrivateKey], capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = signed
    with pytest.raises(RegistryError) as err:
        Registry(FolderStorage(root / "reg")).publish(
            [{"tool": TOOL, "effect": "idempotent", "permission": "x"}], by="mallory",
            status="approved", key=Ed25519PrivateKey.generate())
    assert err.value.code == "untrusted_index" and "neither the --key given" in err.value.message
    assert not (root / "reg" / FILE / "v3.json").exists()
    code, _, _ = run(capsys, "manifests", "verify", "--registry", str(root / "reg"),
                     "--trust", str(root / "trusted.pub"))
    assert code == 0


def test_a_write_without_a_key_to_a_signed_registry_is_refused(
        signed: tuple[Path, Ed25519PrivateKey]) -> None:
    root, _ = signed
    with pytest.raises(RegistryError) as err:
        Registry(FolderStorage(root / "reg")).rollback(TOOL, 1, by="bob")  # no --key
    assert err.value.code == "key_required" and "pass --key" in err.value.message
    assert not (root / "reg" / FILE / "v3.json").exists()


def test_an_unsigned_version_is_refused_while_a_key_is_trusted(
        signed: tuple[Path, Ed25519PrivateKey], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, key = signed
    # A registry written before keys were used, then signed as it is: its index is signed
    # but its versions are not.
    (root / "reg").rename(root / "signed")
    registry = Registry(FolderStorage(root / "reg"))
    for permission in ("payments:refund", "payments:refund-v2", "payments:refund-v3"):
        registry.publish([{"tool": TOOL, "effect": "idempotent", "permission": permission}],
                         by="alice", status="approved")
    registry.sign_index(key)
    assert _refused(root, key, 3).code == "unsigned"
    assert "is not signed" in _verify_exits_1(root, capsys, 3)
    monkeypatch.setenv("UNWIND_MANIFEST_PUBLIC_KEY", str(root / "trusted.pub"))
    code, _, err = run(capsys, "manifests", "verify", "--registry", str(root / "reg"))
    assert code == 1 and f"{TOOL} v3" in err


def test_a_deleted_version_file_is_reported(signed: tuple[Path, Ed25519PrivateKey],
                                            capsys: pytest.CaptureFixture[str]) -> None:
    root, _ = signed
    (root / "reg" / FILE / "v1.json").unlink()
    assert "missing" in [p.code for p in Registry(FolderStorage(root / "reg")).verify()]
    _verify_exits_1(root, capsys, 1)
