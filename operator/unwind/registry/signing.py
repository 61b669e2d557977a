"""Ed25519 keys, signatures over registry versions, and the trust store.

A signature covers ``unwind-manifest:<tool>@<version>:<checksum>``: the checksum pins the
manifest's content, and the tool and version pin *where* it may appear, so a valid
signature copied onto another version (or another tool) no longer verifies. The prefix
keeps these signatures from being mistaken for signatures over anything else made with
the same key.

A trust store holds several public keys so a key can be rotated: the new key is added,
versions are re-signed, and only then is the old key dropped.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from .errors import RegistryError

ENV_PUBLIC_KEY = "UNWIND_MANIFEST_PUBLIC_KEY"
MESSAGE_PREFIX = "unwind-manifest:"
_PEM_BLOCK = re.compile(r"-----BEGIN PUBLIC KEY-----.*?-----END PUBLIC KEY-----", re.DOTALL)


@dataclass(frozen=True)
class Signature:
    """A signature as stored: the signer's key id and the base64 signature bytes."""

    key_id: str
    value: str

    def to_json(self) -> dict[str, str]:
        return {"key_id": self.key_id, "value": self.value}


def signing_message(tool: str, version: int, checksum: str) -> bytes:
    return f"{MESSAGE_PREFIX}{tool}@{version}:{checksum}".encode()


def key_id(public_key: Ed25519PublicKey) -> str:
    """First 16 hex digits of sha256 over the 32 raw public key bytes."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign(private_key: Ed25519PrivateKey, message: bytes) -> Signature:
    value = base64.b64encode(private_key.sign(message)).decode("ascii")
    return Signature(key_id(private_key.public_key()), value)


def verify_signature(public_key: Ed25519PublicKey, message: bytes, value: str) -> bool:
    try:
        public_key.verify(base64.b64decode(value, validate=True), message)
    except (InvalidSignature, binascii.Error, ValueError):
        return False
    return True


def generate_keypair(path: str | os.PathLike[str]) -> tuple[Path, Path, str]:
    """Write ``PATH.key`` (PKCS8 PEM, mode 0600) and ``PATH.pub``; return both and the key id.

    The private key file is created with mode 0600 by ``os.open`` itself, so it is never
    readable by others even for an instant, and an existing key is never overwritten
    (losing a signing key silently would be worse than an error).
    """
    key_path, pub_path = Path(f"{os.fspath(path)}.key"), Path(f"{os.fspath(path)}.pub")
    for existing in (key_path, pub_path):
        if existing.exists():
            raise RegistryError("bad_key", f"{existing} already exists: remove it or choose another path")
    key_path.parent.mkdir(parents=True, exist_ok=True)
    private_key = Ed25519PrivateKey.generate()
    pem = private_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    public_key = private_key.public_key()
    pub_path.write_bytes(public_key.public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo))
    return key_path, pub_path, key_id(public_key)


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise RegistryError("bad_key", f"cannot read the {what} {os.fspath(path)}: "
                            f"{exc.strerror or exc}") from exc


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    data = _read(path, "private key")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise RegistryError("bad_key", f"{os.fspath(path)} is not an unencrypted PEM private key "
                            "(make one with `unwind keygen PATH`)") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise RegistryError("bad_key", f"{os.fspath(path)} holds a {type(key).__name__}, "
                            "not an Ed25519 private key")
    return key


def public_key_from_pem(data: bytes, source: str) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise RegistryError("bad_key", f"{source} is not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise RegistryError("bad_key", f"{source} holds a {type(key).__name__}, not an Ed25519 public key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    return public_key_from_pem(_read(path, "public key"), os.fspath(path))


class TrustStore:
    """The public keys whose signatures are accepted, by key id."""

    def __init__(self, keys: Iterable[Ed25519PublicKey] = ()) -> None:
        self.keys: dict[str, Ed25519PublicKey] = {key_id(k): k for k in keys}

    def __len__(self) -> int:
        return len(self.keys)

    def __contains__(self, kid: object) -> bool:
        return kid in self.keys

    @classmethod
    def from_pem_text(cls, text: str, source: str = "PEM text") -> TrustStore:
        """One or more concatenated ``PUBLIC KEY`` PEM blocks."""
        blocks = _PEM_BLOCK.findall(text)
        if not blocks:
            raise RegistryError("bad_key", f"{source} holds no -----BEGIN PUBLIC KEY----- block")
        return cls(public_key_from_pem(b.encode("ascii"), source) for b in blocks)

    @classmethod
    def from_files(cls, paths: Iterable[str | os.PathLike[str]]) -> TrustStore:
        store = cls()
        for path in paths:
            text = _read(path, "public key").decode("utf-8", "replace")
            store.keys.update(cls.from_pem_text(text, os.fspath(path)).keys)
        return store

    @classmethod
    def from_value(cls, value: str, source: str, base: Path | None = None) -> TrustStore:
        """A PEM (possibly several) or a path to a file of them, as config and env give it."""
        if "-----BEGIN" in value:
            return cls.from_pem_text(value, source)
        path = Path(value).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        return cls.from_files([path])

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TrustStore | None:
        """The store named by ``UNWIND_MANIFEST_PUBLIC_KEY``, or None when it is unset."""
        value = (os.environ if environ is None else environ).get(ENV_PUBLIC_KEY, "").strip()
        return cls.from_value(value, f"${ENV_PUBLIC_KEY}") if value else None

    def check(self, message: bytes, signature: Signature | None) -> str | None:
        """None when the signature is good; otherwise the problem code."""
        if signature is None:
            return "unsigned"
        key = self.keys.get(signature.key_id)
        if key is None:
            return "untrusted"
        return None if verify_signature(key, message, signature.value) else "bad_signature"
