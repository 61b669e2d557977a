"""Leader election's one decision: may this replica write itself into the Lease?"""

from __future__ import annotations

from unwind.operator.leader import may_take


def test_an_empty_lease_may_be_taken() -> None:
    assert may_take(None, "b", 0.0, 15.0)
    assert may_take("", "b", 0.0, 15.0)


def test_the_holder_renews_its_own_lease() -> None:
    assert may_take("a", "a", 0.0, 15.0)


def test_another_holders_lease_is_left_alone_until_it_stops_changing_for_its_duration() -> None:
    assert not may_take("a", "b", 14.9, 15.0)
    assert may_take("a", "b", 15.0, 15.0)
