"""The webhook TLS plan: issue, keep, renew before expiry, replace the CA without a gap."""

from __future__ import annotations

import datetime as dt

from cryptography import x509

from unwind.operator.certs import CA_CERT, CA_KEY, TLS_CERT, TLS_KEY, Lifetimes, expires, plan_tls

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
NAMES = ["unwind-webhook.unwind-system.svc", "127.0.0.1"]
SHORT = Lifetimes(serving=dt.timedelta(seconds=30), ca=dt.timedelta(days=10))


def test_a_first_plan_makes_a_ca_and_a_serving_certificate_for_every_name() -> None:
    data, why = plan_tls(None, NAMES, NOW, SHORT)
    assert data is not None and why == "no CA yet"
    assert set(data) == {CA_CERT, CA_KEY, TLS_CERT, TLS_KEY}
    cert = x509.load_pem_x509_certificate(data[TLS_CERT].encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(n.value) for n in san} == set(NAMES)
    ca = x509.load_pem_x509_certificate(data[CA_CERT].encode())
    assert cert.issuer == ca.subject
    cert.verify_directly_issued_by(ca)


def test_a_fresh_certificate_is_kept() -> None:
    data, _ = plan_tls(None, NAMES, NOW, SHORT)
    assert plan_tls(data, NAMES, NOW + dt.timedelta(seconds=15), SHORT) == (None, "current")


def test_the_serving_certificate_renews_with_a_third_of_its_life_left_under_the_same_ca() -> None:
    data, _ = plan_tls(None, NAMES, NOW, SHORT)
    assert data is not None
    renewed, why = plan_tls(data, NAMES, NOW + dt.timedelta(seconds=21), SHORT)
    assert renewed is not None and why == "the serving certificate is close to expiry"
    assert renewed[CA_CERT] == data[CA_CERT] and renewed[TLS_CERT] != data[TLS_CERT]
    assert expires(renewed[TLS_CERT]) > expires(data[TLS_CERT])  # type: ignore[operator]


def test_a_changed_name_reissues_the_serving_certificate() -> None:
    data, _ = plan_tls(None, NAMES, NOW, SHORT)
    _, why = plan_tls(data, [*NAMES, "unwind-webhook"], NOW, SHORT)
    assert why.startswith("the serving certificate is for")


def test_a_ca_near_its_end_is_joined_by_a_new_one_and_the_old_stays_in_the_bundle() -> None:
    data, _ = plan_tls(None, NAMES, NOW, SHORT)
    assert data is not None
    later = NOW + dt.timedelta(days=8)
    rotated, why = plan_tls(data, NAMES, later, SHORT)
    assert rotated is not None and why.startswith("the CA is close to expiry")
    bundle = x509.load_pem_x509_certificates(rotated[CA_CERT].encode())
    old = x509.load_pem_x509_certificate(data[CA_CERT].encode())
    assert len(bundle) == 2 and bundle[1] == old
    served = x509.load_pem_x509_certificate(rotated[TLS_CERT].encode())
    served.verify_directly_issued_by(bundle[0])


def test_a_secret_holding_garbage_is_replaced() -> None:
    data, why = plan_tls({CA_CERT: "junk", CA_KEY: "junk", TLS_CERT: "x", TLS_KEY: "y"}, NAMES, NOW, SHORT)
    assert data is not None and why == "no CA yet"
