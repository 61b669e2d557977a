"""The error codes a caller can get, with their HTTP status (docs/gateway.md lists them)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STATUS = {
    "validation_error": 400,
    "unauthorized": 401,
    "permission_denied": 403,
    "schema_drift": 403,
    "denied": 403,
    "not_found": 404,
    "duplicate": 409,
    "requires_not_met": 409,
    "rolled_back": 409,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "untrusted_host": 421,
    "unsupported_operation": 422,
    "upstream_conflict": 409,
    "upstream_rejected": 422,
    "approval_required": 428,
    "rate_limited": 429,
    "upstream_error": 502,
    "ledger_unavailable": 503,
    "auth_unavailable": 503,
    "limiter_unavailable": 503,
    "upstream_timeout": 504,
}


@dataclass
class Refusal(Exception):
    """The call is answered with an error envelope; ``extra`` adds fields (e.g. entry)."""

    code: str
    message: str
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.code not in STATUS:
            raise ValueError(f"unknown error code {self.code}")

    @property
    def status(self) -> int:
        return STATUS[self.code]

    def envelope(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message, **self.extra}}


def upstream_refusal(status: int | None) -> str:
    """The code for an upstream's error answer: a conflict (409, or 412 to a precondition)
    and a refusal of the arguments (400, 422) are the caller's to handle, so they reach it
    as 4xx, which clients do not retry as a server error; anything else is 502."""
    if status in (409, 412):
        return "upstream_conflict"
    if status in (400, 422):
        return "upstream_rejected"
    return "upstream_error"
