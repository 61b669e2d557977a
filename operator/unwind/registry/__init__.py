"""The manifest registry: immutable versions, checksums, Ed25519 signatures and trust.

Pure domain code (no kopf, no Kubernetes client). One :class:`Registry` holds all the
rules and works over any :class:`Storage`: the folder storage here, its static HTTPS copy
(:func:`load_remote`), and later the cluster's ControllerRevisions.
"""

from .config import RegistryConfig, load_config, resolve_trust
from .errors import CODES, Problem, RegistryError
from .records import IndexEntry, VersionRecord
from .registry import Outcome, Registry, ToolSummary
from .remote import HttpStorage, load_remote
from .signing import (
    ENV_PUBLIC_KEY,
    Signature,
    TrustStore,
    generate_keypair,
    key_id,
    load_private_key,
    load_public_key,
    sign,
    signing_message,
    verify_signature,
)
from .storage import FolderStorage, Storage, escape_tool

__all__ = ["CODES", "ENV_PUBLIC_KEY", "FolderStorage", "HttpStorage", "IndexEntry", "Outcome",
           "Problem", "Registry", "RegistryConfig", "RegistryError", "Signature", "Storage",
           "ToolSummary", "TrustStore", "VersionRecord", "escape_tool", "generate_keypair",
           "key_id", "load_config", "load_private_key", "load_public_key", "load_remote",
           "resolve_trust", "sign", "signing_message", "verify_signature"]
