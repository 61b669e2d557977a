"""Keys, signatures, the trust store and where trusted keys come from."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.registry import (
    ENV_PUBLIC_KEY,
    RegistryError,
    TrustStore,
    generate_keypair,
    key_id,
    load_config,
    load_private_key,
    load_public_key,
    resolve_trust,
    sign,
    signing_message,
    verify_signature,
)


def test_keygen_writes_a_private_key_only_its_owner_can_read(tmp_path: Path) -> None:
    old = os.umask(0)  # even with a permissive umask the key is created 0600
    try:
        key_path, pub_path, kid = generate_keypair(tmp_path / "keys" / "mf")
    finally:
        os.umask(old)
    assert key_path == tmp_path / "keys" / "mf.key" and pub_path == tmp_path / "keys" / "mf.pub"
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    assert b"BEGIN PRIVATE KEY" in key_path.read_bytes()
    assert b"BEGIN PUBLIC KEY" in pub_path.read_bytes()
    assert key_id(load_public_key(pub_path)) == kid == key_id(load_private_key(key_path).public_key())


def test_keygen_never_overwrites_an_existing_key(tmp_path: Path) -> None:
    generate_keypair(tmp_path / "mf")
    with pytest.raises(RegistryError, match=r"mf\.key already exists"):
        generate_keypair(tmp_path / "mf")


def test_the_key_id_is_the_first_16_hex_of_the_raw_public_key_hash() -> None:
    public = Ed25519PrivateKey.generate().public_key()
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    assert key_id(public) == hashlib.sha256(raw).hexdigest()[:16]


def test_a_signature_covers_tool_version_and_checksum() -> None:
    key = Ed25519PrivateKey.generate()
    message = signing_message("stripe.refund", 3, "sha256:ab")
    assert message == b"unwind-manifest:stripe.refund@3:sha256:ab"
    sig = sign(key, message)
    assert verify_signature(key.public_key(), message, sig.value)
    assert not verify_signature(key.public_key(), signing_message("stripe.refund", 4, "sha256:ab"),
                                sig.value)
    assert not verify_signature(key.public_key(), message, "not base64!")


def test_a_missing_or_wrong_key_file_is_named_in_the_error(tmp_path: Path) -> None:
    with pytest.raises(RegistryError, match=r"nope\.key"):
        load_private_key(tmp_path / "nope.key")
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "ec.key").write_bytes(ec_pem)
    with pytest.raises(RegistryError, match=r"ec\.key holds a .*not an Ed25519"):
        load_private_key(tmp_path / "ec.key")
    (tmp_path / "junk.pub").write_text("hello")
    with pytest.raises(RegistryError, match=r"junk\.pub holds no"):
        TrustStore.from_files([tmp_path / "junk.pub"])


def _pem(key: Ed25519PrivateKey) -> str:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def test_the_env_var_may_hold_several_concatenated_pems_or_a_path(tmp_path: Path) -> None:
    k1, k2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    store = TrustStore.from_env({ENV_PUBLIC_KEY: _pem(k1) + _pem(k2)})
    assert store is not None and set(store.keys) == {key_id(k1.public_key()), key_id(k2.public_key())}
    (tmp_path / "k.pub").write_text(_pem(k1))
    store = TrustStore.from_env({ENV_PUBLIC_KEY: str(tmp_path / "k.pub")})
    assert store is not None and key_id(k1.public_key()) in store
    assert TrustStore.from_env({}) is None


def test_trust_comes_from_the_flag_then_the_env_then_unwind_yaml(tmp_path: Path) -> None:
    k1, k2, k3 = (Ed25519PrivateKey.generate() for _ in range(3))
    (tmp_path / "k1.pub").write_text(_pem(k1))
    (tmp_path / "unwind.yaml").write_text("manifests: reg\nmanifest_public_key: k3.pub\n")
    (tmp_path / "k3.pub").write_text(_pem(k3))
    config = load_config(tmp_path)
    assert config.registry == str(tmp_path / "reg")
    env = {ENV_PUBLIC_KEY: _pem(k2)}
    ids = [key_id(k.public_key()) for k in (k1, k2, k3)]
    flag = resolve_trust([str(tmp_path / "k1.pub")], config, env)
    assert flag is not None and list(flag.keys) == [ids[0]]
    from_env = resolve_trust(None, config, env)
    assert from_env is not None and list(from_env.keys) == [ids[1]]
    from_yaml = resolve_trust(None, config, {})
    assert from_yaml is not None and list(from_yaml.keys) == [ids[2]]
    assert resolve_trust(None, load_config(tmp_path / "elsewhere"), {}) is None


def test_a_trust_store_tells_unsigned_untrusted_and_bad_signatures_apart() -> None:
    k1, k2 = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    store = TrustStore([k1.public_key()])
    message = signing_message("a", 1, "sha256:00")
    assert store.check(message, sign(k1, message)) is None
    assert store.check(message, None) == "unsigned"
    assert store.check(message, sign(k2, message)) == "untrusted"
    assert store.check(signing_message("a", 2, "sha256:00"), sign(k1, message)) == "bad_signature"
