"""The admission webhook server: HTTPS with a certificate that renews in place.

Why not kopf's ``WebhookServer``: it restarts its listener when the certificate files
change, and a restart refuses the requests that arrive meanwhile. Here the certificate is
loaded into the live ``ssl.SSLContext``: new connections get the new certificate, open
ones finish.

``TLSKeeper`` keeps the certificate Secret current (certs.py decides), makes sure every
webhook configuration's ``caBundle`` holds the CA *before* a certificate it issued is
served, and loads the certificate. Every replica runs it; writes use resourceVersion
preconditions, so two replicas renewing at once converge on one certificate.

Who may call: whoever reaches the port can ask for an identity stamp for any identity it
names in a made-up AdmissionReview (a stamp binds one object, so it is no use on another,
but the identity is the caller's word). ``ClientAuth`` makes the server answer only callers
with a client certificate from a CA the operator is given (``UNWIND_WEBHOOK_CLIENT_CA``,
the chart's ``webhook.clientAuth``; the API server presents one when its
``--admission-control-config-file`` names a kubeconfig for the webhook), optionally only
certain common names; the chart's NetworkPolicy limits the port to the API server's
addresses where the network plugin enforces it.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import logging
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from .certs import CA_CERT, TLS_CERT, TLS_KEY, Lifetimes, expires, plan_tls
from .hooks import Admission

log = logging.getLogger("unwind.operator")
TLS_SECRET = "unwind-webhook-tls"
NOOP_PATH = "/noop"  # the benchmark's baseline: the same server, no admission work


@dataclass
class TLSKeeper:
    api: client.ApiClient
    namespace: str
    names: Sequence[str]  # DNS names and IPs the API server dials
    configurations: Sequence[str]  # Validating/MutatingWebhookConfiguration names to keep current
    lifetimes: Lifetimes = field(default_factory=Lifetimes)
    context: ssl.SSLContext = field(default_factory=lambda: ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    # the same certificate, for the gateways' token exchange (exchange.py): no client
    # certificate asked, whatever ClientAuth asks of the webhooks' callers
    open_context: ssl.SSLContext = field(default_factory=lambda: ssl.create_default_context(ssl.Purpose.CLIENT_AUTH))
    loaded: str = ""  # the serving certificate in use
    ca_pem: str = ""  # the CA that signed it (the gateways are given it to check the exchange)
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _version: str | None = None  # the Secret's resourceVersion when last read
    _warned: bool = False

    def __post_init__(self) -> None:
        self.core: Any = client.CoreV1Api(self.api)
        self.admission: Any = client.AdmissionregistrationV1Api(self.api)
        self._dir = Path(tempfile.mkdtemp(prefix="unwind-tls-"))

    def interval(self) -> float:
        return max(1.0, min(60.0, self.lifetimes.serving.total_seconds() / 10))

    async def run(self) -> None:
        while True:
            try:
                await asyncio.to_thread(self.converge)
            except Exception as exc:  # retried: a webhook with the previous certificate still serves
                log.warning("webhook TLS: %s", exc)
            # Not serving yet (e.g. another replica starting at the same moment patched the
            # caBundle first, and our conditional patch was refused): try again at once, not
            # in a minute, or this replica's webhooks stay closed that long.
            await asyncio.sleep(self.interval() if self.ready.is_set() else 1.0)

    def converge(self) -> None:
        data = self._read()
        wanted, why = plan_tls(data, self.names, dt.datetime.now(dt.UTC), self.lifetimes)
        if wanted is not None:
            log.info("webhook TLS: issuing a certificate (%s)", why)
            data = self._write(wanted, data)
        assert data is not None
        self.sync_ca_bundles(data[CA_CERT])
        self.ca_pem = data[CA_CERT]
        if data[TLS_CERT] != self.loaded:
            self._load(data[TLS_CERT], data[TLS_KEY])
            log.info("webhook TLS: serving a certificate valid until %s", expires(data[TLS_CERT]))
        self.ready.set()

    def _read(self) -> dict[str, str] | None:
        try:
            secret = self.core.read_namespaced_secret(TLS_SECRET, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        self._version = secret.metadata.resource_version
        return {k: base64.b64decode(v).decode() for k, v in (secret.data or {}).items()}

    def _write(self, wanted: dict[str, str], current: dict[str, str] | None) -> dict[str, str]:
        body = client.V1Secret(
            metadata=client.V1ObjectMeta(name=TLS_SECRET, labels={"app.kubernetes.io/managed-by": "unwind"},
                                         resource_version=self._version if current is not None else None),
            type="Opaque", data={k: base64.b64encode(v.encode()).decode() for k, v in wanted.items()})
        try:
            if current is None:
                self.core.create_namespaced_secret(self.namespace, body)
            else:
                self.core.replace_namespaced_secret(TLS_SECRET, self.namespace, body)
        except ApiException as exc:
            if exc.status != 409:
                raise
            # another replica renewed first: use what it wrote
            theirs = self._read()
            assert theirs is not None
            return theirs
        return wanted

    def sync_ca_bundles(self, ca_pem: str) -> None:
        """Every webhook of our configurations trusts exactly this CA bundle."""
        bundle = base64.b64encode(ca_pem.encode()).decode()
        found = 0
        for kind, read, patch in (
                ("Validating", self.admission.read_validating_webhook_configuration,
                 self.admission.patch_validating_webhook_configuration),
                ("Mutating", self.admission.read_mutating_webhook_configuration,
                 self.admission.patch_mutating_webhook_configuration)):
            for name in self.configurations:
                try:
                    config = read(name)
                except ApiException as exc:
                    if exc.status == 404:
                        continue  # this configuration kind is not installed
                    raise
                found += 1
                ops = [{"op": "replace" if hook.client_config.ca_bundle else "add",
                        "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                       for i, hook in enumerate(config.webhooks or [])
                       if hook.client_config.ca_bundle != bundle]
                if ops:
                    ops.insert(0, {"op": "test", "path": "/metadata/resourceVersion",
                                   "value": config.metadata.resource_version})
                    patch(name, ops)
                    log.info("webhook TLS: caBundle of %sWebhookConfiguration %s updated", kind, name)
        if not found and not self._warned:
            self._warned = True
            log.error("no webhook configuration named %s is installed: nothing stamps who applied or "
                      "approved a manifest, so no version will be approved; install the chart's "
                      "webhooks (or pass --webhook-configuration)", ", ".join(self.configurations))

    def _load(self, cert: str, key: str) -> None:
        # Fresh file names each time: load_cert_chain reads paths, and the files are gone
        # right after (only the context keeps the key).
        fd, path = tempfile.mkstemp(dir=self._dir, suffix=".pem")
        try:
            with os.fdopen(fd, "w") as out:
                out.write(cert + key)
            self.context.load_cert_chain(path)
            self.open_context.load_cert_chain(path)
        finally:
            os.unlink(path)
        self.loaded = cert


CLIENT_CA_ENV, CLIENT_NAMES_ENV = "UNWIND_WEBHOOK_CLIENT_CA", "UNWIND_WEBHOOK_CLIENT_NAMES"


@dataclass(frozen=True)
class ClientAuth:
    """Which callers the webhook server answers: with ``ca_file``, only those presenting a
    client certificate it signed (the TLS handshake fails for the others), and with
    ``names`` only those whose certificate's common name is one of them."""

    ca_file: str = ""
    names: tuple[str, ...] = ()

    @classmethod
    def from_env(cls) -> ClientAuth:
        names = tuple(n.strip() for n in os.environ.get(CLIENT_NAMES_ENV, "").split(",") if n.strip())
        return cls(os.environ.get(CLIENT_CA_ENV, "").strip(), names)

    def require(self, context: ssl.SSLContext) -> None:
        if not self.ca_file:
            if self.names:
                raise ValueError(f"{CLIENT_NAMES_ENV} names client certificates but {CLIENT_CA_ENV} names no CA "
                                 "to check them with: set both (the chart's webhook.clientAuth)")
            return
        try:
            context.load_verify_locations(cafile=self.ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(f"{CLIENT_CA_ENV}={self.ca_file}: cannot load the webhook client CA ({exc}); "
                             "it must hold the PEM certificate that signs the API server's webhook client "
                             "certificate") from None
        context.verify_mode = ssl.CERT_REQUIRED

    def refusal(self, peer: Any) -> str | None:
        """Why a caller with this (verified) peer certificate is not answered, or None."""
        if not self.names:
            return None
        common = [value for rdn in (peer or {}).get("subject", ()) for key, value in rdn if key == "commonName"]
        if any(name in self.names for name in common):
            return None
        return (f"the client certificate's common name {', '.join(common) or '(none)'} is not one of "
                f"{', '.join(self.names)} ({CLIENT_NAMES_ENV})")


@dataclass
class WebhookServer:
    """HTTPS for the admission webhooks, with the keeper's live SSL context: POST /<handler>
    with an AdmissionReview, answered by ``Admission.review``."""

    tls: TLSKeeper
    admission: Admission
    addr: str = "0.0.0.0"
    port: int = 9443
    clients: ClientAuth = field(default_factory=ClientAuth.from_env)
    exchange: Any = None  # exchange.TokenExchange: served on exchange_port, which asks no client certificate
    exchange_port: int = 0

    async def serve(self) -> None:
        self.clients.require(self.tls.context)  # before the first certificate: no unchecked caller
        await self.tls.ready.wait()

        @aiohttp.web.middleware
        async def callers(request: aiohttp.web.Request, handler: Any) -> aiohttp.web.StreamResponse:
            why = self.clients.refusal(request.transport.get_extra_info("peercert") if request.transport else None)
            if why is not None:
                log.warning("webhook: refused a caller from %s: %s", request.remote, why)
                raise aiohttp.web.HTTPForbidden(reason="this webhook answers only the API server")
            response: aiohttp.web.StreamResponse = await handler(request)
            return response

        async def review(request: aiohttp.web.Request) -> aiohttp.web.Response:
            try:
                data = json.loads(await request.read())
            except ValueError as exc:
                raise aiohttp.web.HTTPBadRequest(reason=f"the body is not JSON: {exc}") from None
            if not isinstance(data, dict) or not isinstance(data.get("request"), dict):
                raise aiohttp.web.HTTPBadRequest(reason="the body is not an AdmissionReview")
            return aiohttp.web.json_response(await self.admission.review(request.match_info["id"], data))

        async def noop(request: aiohttp.web.Request) -> aiohttp.web.Response:
            data = json.loads(await request.read())
            uid = (data.get("request") or {}).get("uid", "")
            return aiohttp.web.json_response({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                              "response": {"uid": uid, "allowed": True}})

        app = aiohttp.web.Application(client_max_size=3 * 1024 * 1024, middlewares=[callers])
        app.add_routes([aiohttp.web.post(NOOP_PATH, noop), aiohttp.web.post("/{id}", review)])
        runner = aiohttp.web.AppRunner(app, handle_signals=False, access_log=None)
        await runner.setup()
        runners = [runner]
        try:
            # reuse_port: a second operator process on the same machine (the local control
            # plane's two-replica test) shares the port; the kernel spreads connections.
            site = aiohttp.web.TCPSite(runner, self.addr, self.port, ssl_context=self.tls.context,
                                       reuse_port=True)
            await site.start()
            log.info("admission webhooks listening on https://%s:%d", self.addr, self.port)
            if self.exchange is not None and self.exchange_port:
                from .exchange import PATH

                door = aiohttp.web.Application(client_max_size=64 * 1024)
                door.add_routes([aiohttp.web.post(PATH, self.exchange.handle)])
                exchange = aiohttp.web.AppRunner(door, handle_signals=False, access_log=None)
                await exchange.setup()
                runners.append(exchange)
                await aiohttp.web.TCPSite(exchange, self.addr, self.exchange_port, ssl_context=self.tls.open_context,
                                          reuse_port=True).start()
                log.info("gateway token exchange listening on https://%s:%d%s", self.addr, self.exchange_port, PATH)
            await asyncio.Event().wait()
        finally:
            for each in runners:
                await each.cleanup()
