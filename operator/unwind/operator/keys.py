"""The operator's signing key (a Secret) and the published trust (a ConfigMap).

The key is created on first start when the Secret does not exist; two operators starting
at once both try to create it, and the loser (409) reads the winner's key. Public keys are
published in the ``unwind-trust`` ConfigMap under ``<key id>.pem``; keys already there are
kept, so a rotated-out key stays trusted until its versions are re-signed.
"""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from ..registry.signing import key_id

SECRET_NAME = "unwind-signing-key"
TRUST_NAME = "unwind-trust"
PRIVATE_KEY = "private.pem"
LABELS = {"app.kubernetes.io/managed-by": "unwind"}


def _load(secret: client.V1Secret) -> Ed25519PrivateKey:
    pem = base64.b64decode((secret.data or {})[PRIVATE_KEY])
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"Secret {SECRET_NAME} does not hold an Ed25519 key in {PRIVATE_KEY}")
    return key


def ensure_signing_key(core: client.CoreV1Api, namespace: str) -> Ed25519PrivateKey:
    try:
        return _load(core.read_namespaced_secret(SECRET_NAME, namespace))
    except ApiException as exc:
        if exc.status != 404:
            raise
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    body = client.V1Secret(
        metadata=client.V1ObjectMeta(name=SECRET_NAME, labels=LABELS),
        type="Opaque",
        data={PRIVATE_KEY: base64.b64encode(pem).decode(),
              "key-id": base64.b64encode(key_id(key.public_key()).encode()).decode()})
    try:
        core.create_namespaced_secret(namespace, body)
        return key
    except ApiException as exc:
        if exc.status != 409:
            raise
        return _load(core.read_namespaced_secret(SECRET_NAME, namespace))


def publish_trust(core: client.CoreV1Api, namespace: str, key: Ed25519PrivateKey) -> str:
    public = key.public_key()
    kid = key_id(public)
    pem = public.public_bytes(serialization.Encoding.PEM,
                              serialization.PublicFormat.SubjectPublicKeyInfo).decode()
    try:
        current = core.read_namespaced_config_map(TRUST_NAME, namespace)
    except ApiException as exc:
        if exc.status != 404:
            raise
        core.create_namespaced_config_map(namespace, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name=TRUST_NAME, labels=LABELS), data={f"{kid}.pem": pem}))
        return kid
    if (current.data or {}).get(f"{kid}.pem") != pem:
        core.patch_namespaced_config_map(TRUST_NAME, namespace, {"data": {f"{kid}.pem": pem}})
    return kid
