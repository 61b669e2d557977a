"""Which public keys the operator publishes in unwind-trust (the pure decision)."""

from __future__ import annotations

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from unwind.operator.keys import Keys, wanted_trust
from unwind.registry.signing import key_id

OLD, NEW = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
KEYS = Keys(NEW, (OLD.public_key(),))
OLD_ID, NEW_ID = key_id(OLD.public_key()), key_id(NEW.public_key())


def test_the_current_key_alone_once_every_bundle_is_signed_with_it() -> None:
    signing = {"a": NEW_ID, "b": NEW_ID}
    assert set(wanted_trust(KEYS, signing, ["a", "b"], published=[OLD_ID, NEW_ID])) == {f"{NEW_ID}.pem"}


def test_a_retired_key_stays_while_a_bundle_is_still_signed_with_it() -> None:
    assert set(wanted_trust(KEYS, {"a": NEW_ID, "b": OLD_ID}, ["a", "b"], published=[])) == \
        {f"{NEW_ID}.pem", f"{OLD_ID}.pem"}


def test_a_published_retired_key_stays_until_every_namespace_was_seen_since_start() -> None:
    assert f"{OLD_ID}.pem" in wanted_trust(KEYS, {"a": NEW_ID}, ["a", "b"], published=[OLD_ID])


def test_a_namespace_deleted_while_signed_with_a_retired_key_keeps_it_in_trust_no_longer() -> None:
    # found in CI: a terminating namespace (never re-signed) kept the old key forever once gone
    assert set(wanted_trust(KEYS, {"a": NEW_ID, "gone": OLD_ID}, ["a"], published=[OLD_ID, NEW_ID])) == \
        {f"{NEW_ID}.pem"}


def test_a_namespace_whose_bundle_is_gone_counts_as_seen_and_holds_no_key() -> None:
    # found in CI: a namespace whose held bundle went before the namespace kept every
    # published key (it never counted as re-checked) until the next resync
    assert set(wanted_trust(KEYS, {"a": NEW_ID, "b": None}, ["a", "b"], published=[OLD_ID, NEW_ID])) == \
        {f"{NEW_ID}.pem"}


def test_a_planted_key_is_never_kept() -> None:
    planted = key_id(Ed25519PrivateKey.generate().public_key())
    assert set(wanted_trust(KEYS, {"a": planted}, ["a", "b"], published=[planted])) == {f"{NEW_ID}.pem"}
