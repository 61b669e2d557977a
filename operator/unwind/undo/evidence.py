"""Signed evidence of a run: its entries, the approvals with the approvers' identities, every
rollback request and the plan it ran, every step's outcome and every settle by hand, in one
JSON file anyone can check.

The signature covers ``unwind-evidence:<digest>``, where the digest is sha256 over the
canonical JSON of the evidence (the manifests' canonical form: sorted keys, no spaces). The
prefix keeps an evidence signature from ever passing for a manifest signature
(``unwind-manifest:``) made with the same key, and the other way round. Verification
recomputes the digest, so changing any byte of the evidence is refused (``digest_mismatch``)
even if the stored digest is changed too (``bad_signature``).
"""

from __future__ import annotations

from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from ..manifest.canonical import canonical_json, checksum_bytes
from ..registry.signing import Signature, TrustStore, sign
from .sources import Snapshot

FORMAT = "unwind.dev/evidence/v1"
MESSAGE_PREFIX = "unwind-evidence:"


class EvidenceError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def build(snapshot: Snapshot, rollbacks: Any, exported: str, source: str,
          dropped: int = 0) -> dict[str, Any]:
    """The evidence of one run (unsigned): every entry, the approvals, every rollback request
    (``rollbacks``: who asked, when, why, what it planned, how it ended; ``rollbacks_dropped``
    older ones the ledger no longer held), every undo step and every settle by hand."""
    entries = [e.to_json() for e in snapshot.entries]
    approvals: list[dict[str, Any]] = []
    for e in snapshot.entries:
        if e.approval is not None:
            a = e.approval
            approvals.append({"entry": e.id, "tool": e.tool, "actor": e.actor,
                              "identities": a.identities, "state": a.state,
                              "rules": a.rules.model_dump(mode="json"),
                              "decisions": [d.model_dump(mode="json") for d in a.decisions]})
        approved = (e.undo or {}).get("approved_by")
        if approved:
            approvals.append({"entry": e.id, "tool": e.tool, "undo": True, **approved})
    steps = [{"entry": e.id, "tool": e.tool, "state": e.state, **(e.undo or {})}
             for e in snapshot.entries if e.undo]
    settles = [{"entry": e.id, "tool": e.tool, **e.settled.model_dump(mode="json", exclude_none=True)}
               for e in snapshot.entries if e.settled is not None]
    return {"ledger": snapshot.name, "run": snapshot.run, "source": source, "exported": exported,
            "entries": entries, "approvals": approvals, "rollbacks": rollbacks, "steps": steps,
            "settles": settles, "rollbacks_dropped": dropped}


def digest_of(evidence: Any) -> str:
    return checksum_bytes(canonical_json(evidence))


def signed(evidence: dict[str, Any], key: Ed25519PrivateKey) -> dict[str, Any]:
    digest = digest_of(evidence)
    signature = sign(key, f"{MESSAGE_PREFIX}{digest}".encode())
    return {"format": FORMAT, "digest": digest, "signature": signature.to_json(),
            "evidence": evidence}


def verify(document: Any, trust: TrustStore) -> dict[str, Any]:
    """The evidence, when the document is intact and signed by a trusted key; else
    EvidenceError with its code."""
    if not isinstance(document, dict) or document.get("format") != FORMAT or \
            not isinstance(document.get("evidence"), dict):
        raise EvidenceError("not_evidence", f"not an evidence file (format {FORMAT}): make one "
                            "with `unwind ledger export`")
    evidence: dict[str, Any] = document["evidence"]
    digest = digest_of(evidence)
    if document.get("digest") != digest:
        raise EvidenceError("digest_mismatch", "the evidence was changed after it was signed: its "
                            f"digest is {digest}, the file says {document.get('digest')}")
    raw = document.get("signature")
    sig = None
    if isinstance(raw, dict) and isinstance(raw.get("key_id"), str) and \
            isinstance(raw.get("value"), str):
        sig = Signature(raw["key_id"], raw["value"])
    problem = trust.check(f"{MESSAGE_PREFIX}{digest}".encode(), sig)
    if problem == "unsigned":
        raise EvidenceError("unsigned", "the evidence carries no signature")
    if problem == "untrusted":
        raise EvidenceError("untrusted", f"signed by key {sig.key_id if sig else '?'}, which is "
                            "not among the trusted keys (--trust)")
    if problem is not None:
        raise EvidenceError("bad_signature", "the signature does not match the evidence: it "
                            "was changed after it was signed, or signed by another key")
    return evidence
