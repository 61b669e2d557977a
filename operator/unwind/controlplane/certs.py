"""Keys and certificates for the local control plane, made with ``cryptography``.

Why this exists: the API server must serve TLS that our clients (kubectl, the kubernetes
Python client, kopf) verify against a CA we control, and it needs a service-account key
pair so that ServiceAccount tokens are real signed tokens (the operator is later run under
one). Nothing here is meant for anything but loopback test clusters.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class CertFiles:
    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    sa_key: Path
    sa_pub: Path
    kubelet_client_cert: Path
    kubelet_client_key: Path


def _write_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    ))
    path.chmod(0o600)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str = "unwind-local-ca") -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn)).issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(
            digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
            key_encipherment=False, data_encipherment=False, key_agreement=False,
            encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue_serving_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cn: str,
    dns: list[str], ips: list[str],
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A TLS server certificate signed by the CA (also usable for webhook servers)."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
    sans += [x509.IPAddress(ipaddress.ip_address(i)) for i in ips]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn)).issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def issue_client_cert(
    ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, cn: str, org: str,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A TLS client certificate: user ``cn`` in group ``org`` for whoever trusts the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, org),
                         x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def pki_layout(directory: Path) -> CertFiles:
    """Where write_pki puts each key and certificate in ``directory``."""
    return CertFiles(
        ca_cert=directory / "ca.crt", ca_key=directory / "ca.key",
        serving_cert=directory / "apiserver.crt", serving_key=directory / "apiserver.key",
        sa_key=directory / "sa.key", sa_pub=directory / "sa.pub",
        kubelet_client_cert=directory / "apiserver-kubelet-client.crt",
        kubelet_client_key=directory / "apiserver-kubelet-client.key",
    )


def write_pki(directory: Path, ips: tuple[str, ...] = ()) -> CertFiles:
    """Create CA, API server serving cert (SAN 127.0.0.1, the first service IP, ``ips``,
    localhost, kubernetes.default...), the API server's client certificate for kubelets and
    the SA keys."""
    directory.mkdir(parents=True, exist_ok=True)
    files = pki_layout(directory)
    ca_key, ca_cert = make_ca()
    _write_key(ca_key, files.ca_key)
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    dns = ["localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc",
           "kubernetes.default.svc.cluster.local"]
    key, cert = issue_serving_cert(ca_key, ca_cert, "kube-apiserver", dns, ["127.0.0.1", "10.0.0.1", *ips])
    _write_key(key, files.serving_key)
    files.serving_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    # for kubectl logs/exec through the kubelet, which asks the API server about each client
    key, cert = issue_client_cert(ca_key, ca_cert, "kube-apiserver-kubelet-client", "system:masters")
    _write_key(key, files.kubelet_client_key)
    files.kubelet_client_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    sa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    _write_key(sa, files.sa_key)
    files.sa_pub.write_bytes(sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return files


def pki_files(directory: Path) -> CertFiles:
    """Where write_pki puts each key and certificate in ``directory``."""
    return pki_layout(directory)


WEBHOOK_CLIENT_CN = "kube-apiserver-webhook-client"


def write_webhook_client(directory: Path) -> Path:
    """A CA of its own and the client certificate the API server presents to admission
    webhooks (``webhook-client-ca.crt``: what an operator given ``UNWIND_WEBHOOK_CLIENT_CA``
    trusts), and the admission configuration that makes it do so; returns the latter (for
    ``--admission-control-config-file``). Made afresh at each start: cheap, and nothing
    else holds them."""
    from ..operator.certs import issue, new_ca

    now = dt.datetime.now(dt.UTC)
    year = dt.timedelta(days=365)
    ca, ca_key = new_ca(now, year)
    cert, key = issue(ca, ca_key, [WEBHOOK_CLIENT_CN], now, year, client=True)
    (directory / "webhook-client-ca.crt").write_text(ca)
    (directory / "webhook-client.crt").write_text(cert)
    key_file = directory / "webhook-client.key"
    key_file.write_text(key)
    key_file.chmod(0o600)
    kubeconfig = directory / "webhook-client.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Config", "users": [
        # "*": every webhook the API server calls, by URL or by Service
        {"name": "*", "user": {"client-certificate": str(directory / "webhook-client.crt"),
                               "client-key": str(key_file)}}]}))
    config = directory / "admission.yaml"
    config.write_text(yaml.safe_dump({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": {
            "apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
            "kubeConfigFile": str(kubeconfig)}}
            for name in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")]}))
    return config


def pki_problem(directory: Path, margin: dt.timedelta = dt.timedelta(days=1),
                ips: tuple[str, ...] = ()) -> str | None:
    """Why the keys in ``directory`` cannot be reused (missing, unreadable, expiring within
    ``margin``, a serving certificate without one of ``ips``), or None when they can."""
    files = pki_files(directory)
    missing = [p.name for p in vars(files).values() if not p.is_file()]
    if missing:
        return f"{directory} lacks {', '.join(missing)}"
    for cert_file in (files.ca_cert, files.serving_cert):
        try:
            cert = x509.load_pem_x509_certificate(cert_file.read_bytes())
        except (OSError, ValueError) as exc:
            return f"{cert_file} cannot be read: {exc}"
        if cert.not_valid_after_utc < dt.datetime.now(dt.UTC) + margin:
            return f"{cert_file} expires on {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
    serving = x509.load_pem_x509_certificate(files.serving_cert.read_bytes())
    try:
        sans = {str(a) for a in serving.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value.get_values_for_type(x509.IPAddress)}
    except x509.ExtensionNotFound:
        sans = set()
    if missing_ips := [ip for ip in ips if ip not in sans]:
        return f"{files.serving_cert} is not valid for {', '.join(missing_ips)}"
    return None
