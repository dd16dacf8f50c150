from datetime import date

import pytest

from inventory.errors import InsufficientStockError, ReservationError, ValidationError
from inventory.reorder import ReorderRule, ceil_div, round_up_to_pack
from inventory.reservations import ReservationBook, ReservationStatus

D1, D2, D3 = date(2024, 2, 1), date(2024, 2, 2), date(2024, 2, 3)


def test_reserve_and_reserved():
    book = ReservationBook()
    first = book.reserve("BOLT", 4, "SO-1", available=10)
    second = book.reserve("BOLT", 6, "SO-2", available=6)
    book.reserve("NUT", 1, "SO-2", available=1)
    assert (first.id, second.id) == (1, 2)
    assert book.reserved("BOLT") == 10
    assert book.reserved("NUT") == 1
    assert book.reserved("GEAR") == 0
    with pytest.raises(InsufficientStockError):
        book.reserve("BOLT", 7, "SO-3", available=6)
    with pytest.raises(ValidationError):
        book.reserve("BOLT", 0, "SO-3", available=6)


def test_reservation_expiry_is_inclusive():
    book = ReservationBook()
    reservation = book.reserve("BOLT", 4, "SO-1", available=10, expires_on=D2)
    assert reservation.is_active(D1) and reservation.is_active(D2)
    assert not reservation.is_active(D3)
    assert book.reserved("BOLT", D2) == 4
    assert book.reserved("BOLT", D3) == 0
    assert book.expire(D2) == []
    assert book.expire(D3) == [reservation]
    assert reservation.status is ReservationStatus.EXPIRED
    assert book.reserved("BOLT") == 0


def test_release_and_consume():
    book = ReservationBook()
    a = book.reserve("BOLT", 5, "SO-1", available=10)
    b = book.reserve("BOLT", 3, "SO-2", available=10)
    assert book.release(a.id).status is ReservationStatus.RELEASED
    assert book.reserved("BOLT") == 3
    with pytest.raises(ReservationError, match="is released"):
        book.release(a.id)
    assert book.consume(b.id, 1) == 1
    assert (b.quantity, b.status) == (2, ReservationStatus.ACTIVE)
    with pytest.raises(ReservationError, match="holds only 2"):
        book.consume(b.id, 3)
    assert book.consume(b.id) == 2
    assert b.status is ReservationStatus.FULFILLED
    assert book.active() == []
    with pytest.raises(ReservationError, match="no reservation 9"):
        book.get(9)


def test_active_filters_by_sku_and_day():
    book = ReservationBook()
    book.reserve("BOLT", 1, "SO-1", available=5, expires_on=D1)
    book.reserve("BOLT", 1, "SO-2", available=5)
    book.reserve("NUT", 1, "SO-3", available=5)
    assert [r.order for r in book.active()] == ["SO-1", "SO-2", "SO-3"]
    assert [r.order for r in book.active("BOLT")] == ["SO-1", "SO-2"]
    assert [r.order for r in book.active("BOLT", D2)] == ["SO-2"]


def test_ceil_div_and_round_up_to_pack():
    assert (ceil_div(10, 5), ceil_div(11, 5), ceil_div(0, 5), ceil_div(1, 5)) == (2, 3, 0, 1)
    assert round_up_to_pack(7, 5) == 10
    assert round_up_to_pack(10, 5) == 10
    assert round_up_to_pack(1, 1) == 1
    assert round_up_to_pack(0, 5) == 0
    assert round_up_to_pack(-3, 5) == 0
    with pytest.raises(ValidationError):
        round_up_to_pack(3, 0)


def test_reorder_rule_validation():
    ReorderRule("BOLT", 5, 5)
    ReorderRule("BOLT", 0, 0)
    with pytest.raises(ValidationError, match="below min"):
        ReorderRule("BOLT", 6, 5)
    with pytest.raises(ValidationError):
        ReorderRule("BOLT", -1, 5)
    with pytest.raises(ValidationError):
        ReorderRule("BOLT", 1, 5, pack_size=0)
    with pytest.raises(ValidationError):
        ReorderRule("BOLT", 1, 5, lead_time_days=-1)


def test_order_quantity_triggers_at_min():
    rule = ReorderRule("BOLT", min_quantity=10, max_quantity=50)
    assert rule.order_quantity(11) == 0
    assert rule.order_quantity(10) == 40
    assert rule.order_quantity(0) == 50
    assert rule.order_quantity(-5) == 55
    assert rule.order_quantity(5, on_order=6) == 0
    assert rule.order_quantity(5, on_order=5) == 40
    assert rule.order_quantity(12, demand=3) == 41


def test_order_quantity_rounds_to_packs():
    rule = ReorderRule("BOLT", min_quantity=10, max_quantity=50, pack_size=12)
    assert rule.order_quantity(10) == 48
    assert rule.order_quantity(2) == 48
    assert rule.order_quantity(1) == 60


def test_lead_time_demand():
    rule = ReorderRule("BOLT", 10, 50, lead_time_days=7)
    assert rule.lead_time_demand(30, 30) == 7
    assert rule.lead_time_demand(31, 30) == 8
    assert rule.lead_time_demand(0, 30) == 0
    assert ReorderRule("BOLT", 10, 50).lead_time_demand(300, 30) == 0
    with pytest.raises(ValidationError):
        rule.lead_time_demand(30, 0)
    assert rule.projected(20, 5, 7) == 18
