"""A small Kubernetes API client for the sidecar: aiohttp, JSON, the pod's own credentials.

The sidecar has 90 MB, and the Kubernetes client library alone costs more than the rest of
the gateway, so the few calls it makes (GET ConfigMaps, the EffectLedger and its status,
Leases) go through the aiohttp session it already has.

Credentials come from where every in-cluster client reads them: the API server from
``KUBERNETES_SERVICE_HOST`` / ``KUBERNETES_SERVICE_PORT`` (HTTPS), the token from the
ServiceAccount token file and the CA from ``ca.crt`` beside it. Projected tokens rotate
(the kubelet rewrites the file), so the file is read again whenever it changed.

Every request has a total timeout: an API server that does not answer is an error the
caller turns into a refusal (the ledger's 503), never a call that waits forever.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import os
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

TOKEN_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_TOKEN_FILE = TOKEN_DIR / "token"
DEFAULT_TIMEOUT_S = 5.0
log = logging.getLogger("unwind.gateway.kube")


class KubeConfigError(Exception):
    """The in-cluster configuration is missing or unreadable; the message says what to set."""


class KubeUnreachable(ConnectionError):
    """The API server did not answer (refused, reset, timed out)."""


@dataclass
class ApiError(Exception):
    """The API server answered with an error status."""

    status: int
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.status} {self.reason}: {self.message}"


@dataclass(frozen=True)
class InClusterConfig:
    server: str
    token_file: Path
    ca_file: Path

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *, token_file: str | None = None,
                 ca_file: str | None = None) -> InClusterConfig:
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeConfigError("not in a pod: KUBERNETES_SERVICE_HOST and "
                                  "KUBERNETES_SERVICE_PORT are not set (run the gateway in a pod, "
                                  "set them to the API server, or use --manifests for local mode)")
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"  # an IPv6 address
        token = Path(token_file or env.get("UNWIND_TOKEN_FILE") or DEFAULT_TOKEN_FILE)
        ca = Path(ca_file or env.get("UNWIND_CA_FILE") or token.parent / "ca.crt")
        for what, path, var in (("token", token, "UNWIND_TOKEN_FILE"), ("CA", ca, "UNWIND_CA_FILE")):
            if not path.is_file():
                raise KubeConfigError(f"the ServiceAccount {what} file {path} does not exist: "
                                      f"mount the token, or set {var}")
        return cls(f"https://{host}:{port}", token, ca)


def token_subject(token: str) -> str | None:
    """The ``sub`` claim of a ServiceAccount JWT (system:serviceaccount:NS:NAME), unverified:
    it is the pod's own token, read to name the actor when UNWIND_ACTOR is not set."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        sub = claims.get("sub")
        return sub if isinstance(sub, str) else None
    except (IndexError, ValueError, AttributeError):
        return None


EXCHANGE_PATH = "/v1/gateway-token"


@dataclass
class ExchangedToken:
    """The gateway's own identity (issue 29, item 10): a token of ServiceAccount
    ``unwind-gateway``, traded at the operator (``UNWIND_TOKEN_EXCHANGE``) for the pod's
    projected token of audience ``unwind-operator``. Renewed when half its life is gone, by
    the first request after that (the bundle's poll makes one every few seconds); a failed
    renewal keeps the token it has until a minute before it expires, and is tried again at
    most every ``retry_s``."""

    url: str
    ca_pem: str
    server_name: str = ""
    retry_s: float = 5.0
    token: str = ""
    renew_at: float = 0.0  # monotonic
    expires_at: float = 0.0
    _tried: float = -1e9
    _ssl: ssl.SSLContext | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> ExchangedToken | None:
        url = environ.get("UNWIND_TOKEN_EXCHANGE", "").strip()
        if not url:
            return None
        ca = environ.get("UNWIND_EXCHANGE_CA", "")
        if "BEGIN CERTIFICATE" not in ca:
            raise KubeConfigError("UNWIND_TOKEN_EXCHANGE is set but UNWIND_EXCHANGE_CA holds no PEM certificate "
                                  "(the injection sets both): without it the operator's answer cannot be checked")
        return cls(url.rstrip("/"), ca, environ.get("UNWIND_EXCHANGE_SERVER_NAME", "").strip())

    def due(self, now: float) -> bool:
        return now >= self.renew_at and now - self._tried >= self.retry_s

    async def renew(self, session: aiohttp.ClientSession, presented: str, now: float) -> None:
        """Trade ``presented`` (the projected token) for a new token; on failure keep the one
        held while it has a minute left, else raise KubeUnreachable (the caller's 503)."""
        self._tried = now
        if self._ssl is None:
            self._ssl = ssl.create_default_context(cadata=self.ca_pem)
        try:
            async with session.post(self.url + EXCHANGE_PATH, headers={"Authorization": f"Bearer {presented}"},
                                    ssl=self._ssl, server_hostname=self.server_name or None) as response:
                body = await response.json(content_type=None)
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as exc:
            return self._failed(f"did not answer ({type(exc).__name__}: {exc})", now,
                                "is the Unwind operator running? `kubectl -n unwind-system get pods`")
        if status != 200 or not isinstance(body, dict) or not isinstance(body.get("token"), str):
            why = body.get("error") if isinstance(body, dict) else None
            return self._failed(f"answered {status}: {why or 'no token'}", now,
                                "the operator's log says why (`kubectl -n unwind-system logs deploy/unwind-operator`)")
        lifetime = _seconds_left(str(body.get("expiresAt") or ""))
        self.token = body["token"]
        self.expires_at = now + lifetime
        self.renew_at = now + lifetime / 2
        log.info("gateway token from the operator (%s) for %.0f s", body.get("serviceAccount"), lifetime)

    def _failed(self, why: str, now: float, hint: str) -> None:
        message = f"the operator's token exchange {self.url} {why}"
        if self.token and now < self.expires_at - 60:
            log.warning("%s; keeping the token held (%.0f s left)", message, self.expires_at - now)
            return
        raise KubeUnreachable(f"{message}: the gateway has no token for the API server ({hint})")


def _seconds_left(stamp: str) -> float:
    try:
        when = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return 600.0  # no expiry said: renew in five minutes
    return max(60.0, (when - dt.datetime.now(dt.UTC)).total_seconds())


class KubeClient:
    """JSON requests to the API server with the pod's token (read again when it changes), or
    with the token the operator traded for it (``exchange``)."""

    def __init__(self, config: InClusterConfig, *, timeout_s: float = DEFAULT_TIMEOUT_S,
                 exchange: ExchangedToken | None = None) -> None:
        self.config = config
        self.exchange = exchange
        self._renewing: asyncio.Lock | None = None
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._ssl: ssl.SSLContext | None = None  # made on the first request
        self._session: aiohttp.ClientSession | None = None
        self._token = ""
        self._token_sig: tuple[int, int, int] | None = None
        self.bytes_sent = 0  # request bodies, for the benchmark

    def token(self) -> str:
        """The current token: one stat per request, a read only when the file changed."""
        try:
            st = self.config.token_file.stat()
            sig = (st.st_ino, st.st_mtime_ns, st.st_size)
            if sig != self._token_sig:
                self._token = self.config.token_file.read_text(encoding="utf-8").strip()
                self._token_sig = sig
        except OSError as exc:
            if not self._token:
                raise KubeConfigError(f"cannot read the token {self.config.token_file}: "
                                      f"{exc.strerror or exc}") from None
        return self._token

    async def request(self, method: str, path: str, body: Any = None, *,
                      content_type: str = "application/json",
                      accept: str = "application/json") -> tuple[int, Any]:
        """(status, decoded JSON body). Raises KubeUnreachable when nothing answered."""
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        if self._ssl is None:
            try:
                self._ssl = ssl.create_default_context(cafile=str(self.config.ca_file))
            except (OSError, ssl.SSLError) as exc:
                raise KubeUnreachable(f"cannot use the CA {self.config.ca_file}: {exc}") from None
        token = await self._exchanged() if self.exchange is not None else self.token()
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode("utf-8")
        headers = {"Authorization": f"Bearer {token}", "Accept": accept}
        if data is not None:
            headers["Content-Type"] = content_type
            self.bytes_sent += len(data)
        started = time.perf_counter()
        try:
            async with self._session.request(method, self.config.server + path, data=data,
                                             headers=headers, ssl=self._ssl) as response:
                raw = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            what = "timed out" if isinstance(exc, TimeoutError) else str(exc)
            raise KubeUnreachable(f"the API server {self.config.server} did not answer "
                                  f"{method} {path}: {what or type(exc).__name__}") from None
        if log.isEnabledFor(logging.DEBUG):
            log.debug("api %s %s %d %.1f ms, %d bytes sent", method, path, status,
                      (time.perf_counter() - started) * 1000, len(data or b""))
        try:
            decoded = json.loads(raw) if raw else None
        except ValueError:
            decoded = {"message": raw[:200].decode("utf-8", "replace")}
        return status, decoded

    async def _exchanged(self) -> str:
        exchange = self.exchange
        assert exchange is not None and self._session is not None
        if exchange.due(time.monotonic()):
            self._renewing = self._renewing or asyncio.Lock()
            async with self._renewing:  # one renewal at a time; the others use its token
                if exchange.due(time.monotonic()):
                    await exchange.renew(self._session, self.token(), time.monotonic())
        if not exchange.token:
            raise KubeUnreachable(f"no token from the operator's token exchange {exchange.url} yet")
        return exchange.token

    async def get(self, path: str, *, metadata_only: bool = False) -> Any | None:
        """The object, or None when it does not exist (404). ``metadata_only`` asks for the
        PartialObjectMetadata form: the resourceVersion without the data."""
        accept = ("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
                  if metadata_only else "application/json")
        status, body = await self.request("GET", path, accept=accept)
        if status == 404:
            return None
        check(status, body, "GET", path)
        return body

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def check(status: int, body: Any, method: str, path: str) -> None:
    if status < 400:
        return
    message = body.get("message", "") if isinstance(body, dict) else ""
    reason = body.get("reason", "") if isinstance(body, dict) else ""
    raise ApiError(status, reason or "Error", f"{method} {path}: {message}")
