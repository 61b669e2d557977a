"""A throwaway CA and a static HTTPS file server on 127.0.0.1, for the remote loader tests.

The client trusts only the generated CA file, so a test passes only if the loader really
verifies the server certificate (SAN 127.0.0.1) against the CA it was given.
"""

from __future__ import annotations

import datetime
import functools
import http.server
import ipaddress
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Tls:
    ca_file: Path
    cert_file: Path
    key_file: Path


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_tls(folder: Path) -> Tls:
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (x509.CertificateBuilder().subject_name(_name("unwind test CA"))
               .issuer_name(_name("unwind test CA")).public_key(ca_key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                            content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False,
                                            encipher_only=False, decipher_only=False), critical=True)
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                              critical=False)
               .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1"))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
                critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                           critical=False)
            .sign(ca_key, hashes.SHA256()))
    tls = Tls(folder / "ca.pem", folder / "server.pem", folder / "server.key")
    tls.ca_file.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    tls.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    tls.key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                               serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return tls


class _Handler(http.server.SimpleHTTPRequestHandler):
    requested: list[str]

    def do_GET(self) -> None:
        self.server.requested.append(self.path)  # type: ignore[attr-defined]
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass
class Server:
    base_url: str
    root: Path
    requested: list[str]


@contextmanager
def serve(root: Path, tls: Tls | None) -> Iterator[Server]:
    """Serve ``root`` as static files on 127.0.0.1 (HTTPS when ``tls`` is given)."""
    with _run(functools.partial(_Handler, directory=str(root)), root, tls) as server:
        yield server


Respond = Callable[[http.server.BaseHTTPRequestHandler], None]


class _Scripted(http.server.SimpleHTTPRequestHandler):
    """Answers GETs with a test's own function (a redirect, a trickle, a delay...)."""

    def do_GET(self) -> None:
        self.server.requested.append(self.path)  # type: ignore[attr-defined]
        self.server.respond(self)  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def serve_scripted(respond: Respond, tls: Tls | None, root: Path | None = None) -> Iterator[Server]:
    """A server on 127.0.0.1 whose every GET is answered by ``respond(handler)``; with
    ``root``, the handler can also serve files from it (``handler.send_head()``...)."""
    directory = str(root) if root is not None else "."
    with _run(functools.partial(_Scripted, directory=directory), root or Path("."), tls,
              respond) as server:
        yield server


@contextmanager
def _run(handler: Callable[..., Any], root: Path, tls: Tls | None,
         respond: Respond | None = None) -> Iterator[Server]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    httpd.daemon_threads = True
    httpd.respond = respond  # type: ignore[attr-defined]
    requested: list[str] = []
    httpd.requested = requested  # type: ignore[attr-defined]
    scheme = "http"
    if tls is not None:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert_file, tls.key_file)
        httpd.socket = context.wrap_socket(httpd.socket, server_side=True)
        scheme = "https"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield Server(f"{scheme}://127.0.0.1:{httpd.server_address[1]}", root, requested)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)
