"""The manifest registry: immutable versions, checksums, Ed25519 signatures, a signed index
with a generation and an expiry, and trust.

Pure domain code (no kopf, no Kubernetes client). One :class:`Registry` holds all the
rules and works over any :class:`Storage`: the folder storage here, its static HTTPS copy
(:func:`load_remote`), and later the cluster's ControllerRevisions.
"""

from .config import RegistryConfig, load_config, resolve_trust
from .errors import CODES, Problem, RegistryError
from .index import DEFAULT_INDEX_TTL, RegistryIndex
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
from .state import FileGenerations, Generations, MemoryGenerations, default_state_file
from .storage import FolderStorage, Storage, escape_tool

__all__ = ["CODES", "DEFAULT_INDEX_TTL", "ENV_PUBLIC_KEY", "FileGenerations", "FolderStorage",
           "Generations", "HttpStorage", "IndexEntry", "MemoryGenerations", "Outcome",
           "Problem", "Registry", "RegistryConfig", "RegistryError", "RegistryIndex",
           "Signature", "Storage", "ToolSummary", "TrustStore", "VersionRecord",
           "default_state_file", "escape_tool", "generate_keypair", "key_id", "load_config",
           "load_private_key", "load_public_key", "load_remote", "resolve_trust", "sign",
           "signing_message", "verify_signature"]
