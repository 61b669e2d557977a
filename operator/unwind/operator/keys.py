"""The operator's signing key (a Secret) and the published trust (a ConfigMap).

Secret ``unwind-signing-key`` (operator namespace) holds the current Ed25519 key
(``private.pem``) and the public halves of the keys it replaced (``retired.pem``). It is
created on first start when absent; two operators starting at once both try, and the loser
(409) reads the winner's key. ``unwind rotate-signing-key`` replaces the key and retires
the old one.

ConfigMap ``unwind-trust`` is what gateways verify bundles with. The operator owns it as
the *exact* set of keys it intends: the current key, plus retired keys that still sign a
namespace's bundle not yet re-signed. Any other key found there (planted, or left over) is
removed, and a deleted ConfigMap is written again. Identity stamps are verified with the
current and every retired key (a rotation must not forget who applied what).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..registry.signing import Signature, TrustStore, key_id, sign

SECRET_NAME = "unwind-signing-key"
TRUST_NAME = "unwind-trust"
PRIVATE_KEY = "private.pem"
RETIRED_KEYS = "retired.pem"
LABELS = {"app.kubernetes.io/managed-by": "unwind"}


@dataclass(frozen=True)
class Keys:
    current: Ed25519PrivateKey
    retired: tuple[Ed25519PublicKey, ...] = ()

    @property
    def kid(self) -> str:
        return key_id(self.current.public_key())

    def all_public(self) -> TrustStore:
        return TrustStore([self.current.public_key(), *self.retired])


def _pem(key: Ed25519PublicKey) -> str:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def _private_pem(key: Ed25519PrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _load(secret: client.V1Secret) -> Keys:
    data = secret.data or {}
    pem = base64.b64decode(data[PRIVATE_KEY])
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"Secret {SECRET_NAME} does not hold an Ed25519 key in {PRIVATE_KEY}")
    retired_text = base64.b64decode(data.get(RETIRED_KEYS, "")).decode() if data.get(RETIRED_KEYS) else ""
    retired = tuple(TrustStore.from_pem_text(retired_text, RETIRED_KEYS).keys.values()) if retired_text else ()
    return Keys(key, retired)


def _body(keys: Keys, resource_version: str | None = None) -> client.V1Secret:
    data = {PRIVATE_KEY: base64.b64encode(_private_pem(keys.current)).decode(),
            "key-id": base64.b64encode(keys.kid.encode()).decode()}
    if keys.retired:
        data[RETIRED_KEYS] = base64.b64encode("".join(_pem(k) for k in keys.retired).encode()).decode()
    return client.V1Secret(metadata=client.V1ObjectMeta(name=SECRET_NAME, labels=LABELS,
                                                        resource_version=resource_version),
                           type="Opaque", data=data)


def ensure_signing_key(core: client.CoreV1Api, namespace: str) -> Keys:
    try:
        return _load(core.read_namespaced_secret(SECRET_NAME, namespace))
    except ApiException as exc:
        if exc.status != 404:
            raise
    keys = Keys(Ed25519PrivateKey.generate())
    try:
        core.create_namespaced_secret(namespace, _body(keys))
        return keys
    except ApiException as exc:
        if exc.status != 409:
            raise
        return _load(core.read_namespaced_secret(SECRET_NAME, namespace))


def rotate_signing_key(core: client.CoreV1Api, namespace: str) -> tuple[str, str]:
    """A new current key; the old one joins the retired keys. Returns (old, new) key ids."""
    secret: Any = core.read_namespaced_secret(SECRET_NAME, namespace)
    old = _load(secret)
    new = Keys(Ed25519PrivateKey.generate(), (old.current.public_key(), *old.retired))
    core.replace_namespaced_secret(SECRET_NAME, namespace, _body(new, secret.metadata.resource_version))
    return old.kid, new.kid


def trust_data(keys: Iterable[Ed25519PublicKey]) -> dict[str, str]:
    return {f"{key_id(k)}.pem": _pem(k) for k in keys}


def converge_trust(core: client.CoreV1Api, namespace: str, wanted: dict[str, str]) -> bool:
    """Make ConfigMap unwind-trust hold exactly ``wanted``; True when it wrote."""
    try:
        current = core.read_namespaced_config_map(TRUST_NAME, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespaced_config_map(namespace, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=TRUST_NAME, labels=LABELS), data=wanted))
        return True
    if (current.data or {}) == wanted:
        return False
    current.data = wanted
    core.replace_namespaced_config_map(TRUST_NAME, namespace, current)
    return True


def wanted_trust(keys: Keys, signing: Mapping[str, str | None], live: Iterable[str],
                 published: Iterable[str]) -> dict[str, str]:
    """The keys gateways should trust: the current one, retired ones that still sign the
    bundle of a namespace that is still there (``signing``: namespace -> key id of its bundle,
    None for no bundle, for every namespace reconciled since the keys last changed; ``live``:
    the namespaces being reconciled), and — until every live namespace has been reconciled
    once since then — retired ones already published (a bundle nobody re-checked may use
    them). A namespace that is gone holds no key, whatever it was last signed with."""
    live = set(live)
    needed = {keys.kid, *(kid for namespace, kid in signing.items() if kid and namespace in live)}
    if not live <= set(signing):
        needed |= set(published)
    known = {key_id(k): k for k in (keys.current.public_key(), *keys.retired)}
    return trust_data(known[k] for k in sorted(needed) if k in known)


class KeyKeeper:
    """Holds the current keys; every ``interval`` seconds it reloads the Secret (a rotated
    key takes effect without a restart) and, on the leader, makes unwind-trust exactly what
    it should be (a deleted, edited or stuffed ConfigMap is written again)."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core, self.namespace = core, namespace
        self.keys = ensure_signing_key(core, namespace)
        # namespace -> key id its bundle is signed with now (None: it has no bundle), for every
        # namespace reconciled since the keys last changed
        self.signing: dict[str, str | None] = {}

    def sign(self, message: bytes) -> Signature:
        return sign(self.keys.current, message)

    def record(self, namespace: str, kid: str | None) -> None:
        self.signing[namespace] = kid

    def forget(self, namespace: str) -> None:
        """The namespace is gone, and its bundle with it."""
        self.signing.pop(namespace, None)

    def reload(self) -> bool:
        """Read the Secret again; True when the keys changed (every bundle must be re-signed)."""
        keys = ensure_signing_key(self.core, self.namespace)
        changed = keys.kid != self.keys.kid or {key_id(k) for k in keys.retired} != \
            {key_id(k) for k in self.keys.retired}
        if changed:
            self.keys = keys
            self.signing = {}  # nothing is known to be signed with the new key yet
        return changed

    def converge_trust(self, namespaces: Iterable[str]) -> list[str] | None:
        """Write unwind-trust when it differs from what it should be; the key ids it now
        holds when it wrote, else None."""
        try:
            published = set(self.core.read_namespaced_config_map(TRUST_NAME, self.namespace).data or {})
        except ApiException as exc:
            if exc.status != 404:
                raise
            published = set()
        wanted = wanted_trust(self.keys, self.signing, namespaces,
                              (name.removesuffix(".pem") for name in published))
        if not converge_trust(self.core, self.namespace, wanted):
            return None
        return sorted(name.removesuffix(".pem") for name in wanted)
