"""The admission webhooks' TLS: a CA and a serving certificate, made with ``cryptography``.

The API server calls the webhooks over HTTPS and trusts the ``caBundle`` of each webhook
configuration. The operator keeps, in one Secret of its namespace, a CA (``ca.crt`` may
hold several CA certificates while one is replaced; ``ca.key`` is the newest one's key)
and a serving certificate (``tls.crt``/``tls.key``) for the names the API server dials.

Renewal happens well before expiry: a certificate with less than a third of its lifetime
left is replaced. The serving certificate is re-issued by the same CA, so the caBundle
does not change and no request is refused; a CA close to its end is replaced by a new one
that is *added* to the bundle, the old one staying until it expires.

Pure code: ``plan_tls`` says what the Secret should hold; webhook.py reads and writes it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"
RENEW_FRACTION = 1 / 3  # renew when less than this share of the lifetime is left
BACKDATE = dt.timedelta(minutes=1)  # absorbs small clock differences between nodes


@dataclass(frozen=True)
class Lifetimes:
    serving: dt.timedelta = dt.timedelta(days=90)
    ca: dt.timedelta = dt.timedelta(days=3650)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _validity(builder: x509.CertificateBuilder, now: dt.datetime, lifetime: dt.timedelta) -> x509.CertificateBuilder:
    return builder.not_valid_before(now - BACKDATE).not_valid_after(now + lifetime)


def new_ca(now: dt.datetime, lifetime: dt.timedelta) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"unwind-webhook-ca-{now:%Y%m%d%H%M%S}")])
    cert = (_validity(x509.CertificateBuilder(), now, lifetime)
            .subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    return _cert_pem(cert), _key_pem(key)


def _san(names: Sequence[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in names:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


def issue(ca_cert_pem: str, ca_key_pem: str, names: Sequence[str], now: dt.datetime,
          lifetime: dt.timedelta, *, client: bool = False) -> tuple[str, str]:
    """A serving certificate for ``names`` (DNS names or IP addresses), signed by the CA;
    with ``client`` a client certificate for ``names[0]`` (what the API server presents to
    webhooks that ask for one)."""
    ca = x509.load_pem_x509_certificate(ca_cert_pem.encode())
    ca_key = serialization.load_pem_private_key(ca_key_pem.encode(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (_validity(x509.CertificateBuilder(), now, min(lifetime, ca.not_valid_after_utc - now))
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .add_extension(x509.SubjectAlternativeName(_san(names)), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH if client
                                                  else ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _cert_pem(cert), _key_pem(key)


def _certs(pem: str) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem.encode())
    except ValueError:
        return []


def _fresh(cert: x509.Certificate, now: dt.datetime) -> bool:
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return start <= now + BACKDATE and (end - now) > (end - start - BACKDATE) * RENEW_FRACTION


def _names(cert: x509.Certificate) -> set[str]:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return {str(n.value) for n in san}


def plan_tls(current: dict[str, str] | None, names: Sequence[str], now: dt.datetime,
             lifetimes: Lifetimes) -> tuple[dict[str, str] | None, str]:
    """The Secret data to write (None: keep the current one) and why."""
    current = current or {}
    cas = _certs(current.get(CA_CERT, ""))
    newest = cas[0] if cas else None
    why = ""
    if newest is None or not current.get(CA_KEY):
        ca_pem, ca_key = new_ca(now, lifetimes.ca)
        bundle, why = ca_pem, "no CA yet"
    elif not _fresh(newest, now):
        ca_pem, ca_key = new_ca(now, lifetimes.ca)
        # the old CA stays in the bundle until it expires: certificates it issued still verify
        bundle = ca_pem + "".join(_cert_pem(c) for c in cas if c.not_valid_after_utc > now)
        why = "the CA is close to expiry: a new CA joins the bundle"
    else:
        ca_pem, ca_key = _cert_pem(newest), current[CA_KEY]
        bundle = current[CA_CERT]
    serving = _certs(current.get(TLS_CERT, ""))
    if not why:
        if not serving or not current.get(TLS_KEY):
            why = "no serving certificate yet"
        elif not _fresh(serving[0], now):
            why = "the serving certificate is close to expiry"
        elif _names(serving[0]) != set(names):
            why = f"the serving certificate is for {sorted(_names(serving[0]))}, not {sorted(set(names))}"
        elif serving[0].issuer != newest.subject:  # type: ignore[union-attr]
            why = "the serving certificate was issued by another CA"
        else:
            return None, "current"
    cert, key = issue(ca_pem, ca_key, names, now, lifetimes.serving)
    return {CA_CERT: bundle, CA_KEY: ca_key, TLS_CERT: cert, TLS_KEY: key}, why


def expires(pem: str) -> dt.datetime | None:
    certs = _certs(pem)
    return certs[0].not_valid_after_utc if certs else None
