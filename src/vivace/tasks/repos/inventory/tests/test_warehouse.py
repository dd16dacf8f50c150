from datetime import date

import pytest

from inventory.errors import (
    CapacityError,
    InsufficientStockError,
    InventoryError,
    ReservationError,
    UnknownItemError,
    UnknownLocationError,
    ValidationError,
)
from inventory.models import MovementKind
from inventory.reorder import ReorderRule
from inventory.warehouse import Warehouse

D1, D2, D3, D10 = date(2024, 3, 1), date(2024, 3, 2), date(2024, 3, 3), date(2024, 3, 10)


@pytest.fixture
def wh() -> Warehouse:
    w = Warehouse()
    w.add_item("BOLT", "Hex bolt M8")
    w.add_item("NUT", "Nut M8", valuation="average")
    w.add_location("A-1")
    w.add_location("B-1", capacity=20)
    return w


def test_master_data(wh):
    assert wh.item("BOLT").name == "Hex bolt M8"
    cog = wh.add_item("COG", "Cog", unit="pcs", valuation="average")
    assert (cog.sku, cog.unit, cog.valuation) == ("COG", "pcs", "average")
    assert wh.add_location("C-9", capacity=5).capacity == 5
    assert wh.location("B-1").capacity == 20
    with pytest.raises(InventoryError, match="already exists"):
        wh.add_item("BOLT", "Again")
    with pytest.raises(InventoryError, match="already exists"):
        wh.add_location("A-1")
    with pytest.raises(UnknownItemError) as info:
        wh.item("GEAR")
    assert str(info.value) == "unknown item 'GEAR'"
    with pytest.raises(UnknownLocationError) as info:
        wh.location("Z-9")
    assert info.value.code == "Z-9"
    assert wh.add_location("C-1", "Cold room").name == "Cold room"
    with pytest.raises(ValidationError):
        wh.add_item("WIDGET", "Widget", valuation="magic")
    with pytest.raises(UnknownItemError):
        wh.item("WIDGET")


def test_receive_and_on_hand(wh):
    movement = wh.receive("BOLT", 10, "A-1", 100, D1, reference="PO-1")
    assert (movement.kind, movement.destination, movement.unit_cost, movement.reference) == (
        MovementKind.RECEIPT,
        "A-1",
        100,
        "PO-1",
    )
    wh.receive("BOLT", 5, "B-1", 120, D1)
    assert wh.on_hand("BOLT") == 15
    assert wh.on_hand("BOLT", "B-1") == 5
    assert wh.stock_value("BOLT") == 1600
    assert wh.unit_cost("BOLT") == 107
    with pytest.raises(UnknownLocationError):
        wh.on_hand("BOLT", "Z-9")
    with pytest.raises(UnknownItemError):
        wh.receive("GEAR", 1, "A-1", 1, D1)
    with pytest.raises(ValidationError):
        wh.receive("BOLT", 0, "A-1", 1, D1)


def test_capacity_is_checked_exactly(wh):
    wh.receive("BOLT", 15, "B-1", 100, D1)
    wh.receive("NUT", 5, "B-1", 10, D1)
    with pytest.raises(CapacityError, match="holds 20 of 20; cannot add 1"):
        wh.receive("NUT", 1, "B-1", 10, D1)
    wh.issue("NUT", 1, "B-1", D2)
    wh.receive("BOLT", 1, "B-1", 100, D2)
    assert wh.movements.units_at("B-1") == 20
    wh.add_location("C-1", capacity=0)
    with pytest.raises(CapacityError):
        wh.receive("BOLT", 1, "C-1", 100, D2)


def test_issue_uses_valuation(wh):
    wh.receive("BOLT", 10, "A-1", 100, D1)
    wh.receive("BOLT", 10, "A-1", 200, D2)
    movement = wh.issue("BOLT", 15, "A-1", D3, reference="SO-9")
    assert (movement.kind, movement.source, movement.quantity) == (MovementKind.ISSUE, "A-1", 15)
    assert movement.unit_cost == 133  # (10*100 + 5*200) / 15
    assert wh.stock_value("BOLT") == 1000
    wh.receive("NUT", 3, "A-1", 10, D3)
    wh.receive("NUT", 1, "A-1", 11, D3)
    assert wh.issue("NUT", 2, "A-1", D3).unit_cost == 11  # 20.5 -> 21 for two -> 10.5 -> 11
    assert wh.stock_value() == 1000 + 20


def test_issue_checks_location_and_free_stock(wh):
    wh.receive("BOLT", 6, "A-1", 100, D1)
    wh.receive("BOLT", 4, "B-1", 100, D1)
    with pytest.raises(InsufficientStockError) as info:
        wh.issue("BOLT", 5, "B-1", D2)
    assert (info.value.location, info.value.available) == ("B-1", 4)
    wh.issue("BOLT", 4, "B-1", D2)
    wh.reserve("BOLT", 5, "SO-1", D2)
    assert wh.available("BOLT") == 1
    with pytest.raises(InsufficientStockError) as info:
        wh.issue("BOLT", 2, "A-1", D2)
    assert info.value.available == 1
    wh.issue("BOLT", 1, "A-1", D2)
    assert wh.on_hand("BOLT") == 5


def test_transfer(wh):
    wh.receive("BOLT", 10, "A-1", 100, D1)
    wh.transfer("BOLT", 4, "A-1", "B-1", D2)
    assert wh.on_hand("BOLT", "A-1") == 6
    assert wh.on_hand("BOLT", "B-1") == 4
    assert wh.stock_value("BOLT") == 1000
    wh.transfer("BOLT", 6, "A-1", "B-1", D2)
    assert wh.movements.by_location("BOLT") == {"B-1": 10}
    with pytest.raises(InsufficientStockError) as info:
        wh.transfer("BOLT", 1, "A-1", "B-1", D2)
    assert (info.value.sku, info.value.requested, info.value.available, info.value.location) == ("BOLT", 1, 0, "A-1")
    with pytest.raises(UnknownLocationError):
        wh.transfer("BOLT", 1, "B-1", "Z-9", D2)
    wh.receive("NUT", 11, "A-1", 1, D2)
    with pytest.raises(CapacityError):
        wh.transfer("NUT", 11, "A-1", "B-1", D2)
    wh.transfer("NUT", 10, "A-1", "B-1", D2)
    assert wh.on_hand("NUT", "B-1") == 10


def test_adjust(wh):
    wh.receive("BOLT", 10, "A-1", 100, D1)
    found = wh.adjust("BOLT", "A-1", 2, D2)
    assert (found.destination, found.unit_cost) == ("A-1", 100)
    assert wh.on_hand("BOLT") == 12 and wh.stock_value("BOLT") == 1200
    wh.adjust("BOLT", "A-1", 1, D2, unit_cost=40)
    assert wh.stock_value("BOLT") == 1240
    lost = wh.adjust("BOLT", "A-1", -3, D3, reference="count")
    assert lost.reference == "count"
    assert (lost.kind, lost.source, lost.quantity) == (MovementKind.ADJUSTMENT, "A-1", 3)
    assert wh.on_hand("BOLT") == 10
    with pytest.raises(ValidationError):
        wh.adjust("BOLT", "A-1", 0, D3)
    with pytest.raises(InsufficientStockError):
        wh.adjust("BOLT", "A-1", -11, D3)
    with pytest.raises(CapacityError):
        wh.adjust("BOLT", "B-1", 21, D3)


def test_reserve_and_fulfil(wh):
    wh.receive("BOLT", 10, "A-1", 100, D1)
    reservation = wh.reserve("BOLT", 6, "SO-1", D1, days=2)
    assert reservation.expires_on == D3
    with pytest.raises(InsufficientStockError):
        wh.reserve("BOLT", 5, "SO-2", D1)
    movement = wh.fulfil(reservation.id, "A-1", D2, quantity=2)
    assert (movement.quantity, movement.reference) == (2, "SO-1")
    assert reservation.quantity == 4
    assert wh.available("BOLT") == 4
    with pytest.raises(ReservationError, match="reservation 1 holds only 4"):
        wh.fulfil(reservation.id, "A-1", D2, quantity=5)
    assert wh.on_hand("BOLT") == 8
    wh.fulfil(reservation.id, "A-1", D3)
    assert wh.on_hand("BOLT") == 4 and wh.available("BOLT") == 4
    with pytest.raises(InventoryError):
        wh.fulfil(reservation.id, "A-1", D3)


def test_expired_reservations_free_stock(wh):
    wh.receive("BOLT", 10, "A-1", 100, D1)
    reservation = wh.reserve("BOLT", 10, "SO-1", D1, days=0)
    assert wh.available("BOLT", D1) == 0
    assert wh.available("BOLT", D2) == 10
    with pytest.raises(InventoryError, match="not active on 2024-03-02"):
        wh.fulfil(reservation.id, "A-1", D2)
    wh.issue("BOLT", 10, "A-1", D2)
    with pytest.raises(ValidationError):
        wh.reserve("BOLT", 1, "SO-2", D2, days=-1)


def test_on_order_tracking(wh):
    wh.place_order("BOLT", 30)
    wh.place_order("BOLT", 10)
    assert wh.on_order("BOLT") == 40
    wh.receive("BOLT", 15, "A-1", 100, D1)
    assert wh.on_order("BOLT") == 25
    wh.receive("BOLT", 30, "A-1", 100, D1)
    assert wh.on_order("BOLT") == 0
    assert wh.on_order("NUT") == 0
    with pytest.raises(ValidationError):
        wh.place_order("BOLT", 0)
    with pytest.raises(UnknownItemError):
        wh.place_order("GEAR", 1)
    with pytest.raises(UnknownItemError):
        wh.on_hand("GEAR")


def test_reorder_suggestions(wh):
    wh.set_reorder_rule(ReorderRule("BOLT", min_quantity=10, max_quantity=40, pack_size=5, lead_time_days=5))
    wh.set_reorder_rule(ReorderRule("NUT", min_quantity=2, max_quantity=10))
    with pytest.raises(UnknownItemError):
        wh.set_reorder_rule(ReorderRule("GEAR", 1, 2))
    wh.receive("BOLT", 30, "A-1", 100, D1)
    wh.receive("NUT", 3, "A-1", 10, D1)
    assert wh.reorder_suggestions(D10) == []
    wh.issue("NUT", 1, "A-1", D2)
    wh.issue("BOLT", 20, "A-1", D2)
    result = wh.reorder_suggestions(D10)
    assert [(s.sku, s.quantity) for s in result] == [("BOLT", 35), ("NUT", 8)]


def test_reorder_window_and_rounding(wh):
    wh.set_reorder_rule(ReorderRule("BOLT", min_quantity=10, max_quantity=40, pack_size=5, lead_time_days=5))
    wh.receive("BOLT", 30, "A-1", 100, D1)
    wh.issue("BOLT", 10, "A-1", D1)
    wh.issue("BOLT", 6, "A-1", D2)
    later = date(2024, 3, 11)
    assert wh.reorder_suggestions(later, period_days=10) == []  # D1 not in window: demand 3, projected 11
    (s,) = wh.reorder_suggestions(D10, period_days=10)  # D1 in window: demand ceil(16*5/10)=8
    assert (s.sku, s.available, s.on_order, s.demand, s.quantity) == ("BOLT", 14, 0, 8, 35)
    wh.place_order("BOLT", 4)
    wh.reserve("BOLT", 4, "SO-1", D2)
    assert wh.reorder_suggestions(later, period_days=10) == []  # projected 10 + 4 - 3 = 11
    wh.reserve("BOLT", 1, "SO-2", D2)
    (s,) = wh.reorder_suggestions(later, period_days=10)
    assert (s.available, s.on_order, s.demand, s.quantity) == (9, 4, 3, 30)


def test_reorder_suggests_a_single_unit(wh):
    wh.set_reorder_rule(ReorderRule("NUT", min_quantity=5, max_quantity=6))
    wh.receive("NUT", 6, "A-1", 10, D1)
    assert wh.reorder_suggestions(D1) == []
    wh.issue("NUT", 1, "A-1", D1)
    assert [(s.sku, s.quantity) for s in wh.reorder_suggestions(D1)] == [("NUT", 1)]


def test_out_of_order_dates_change_nothing(wh):
    wh.receive("BOLT", 10, "A-1", 100, D2)
    for action in (
        lambda: wh.receive("BOLT", 1, "A-1", 100, D1),
        lambda: wh.issue("BOLT", 1, "A-1", D1),
        lambda: wh.adjust("BOLT", "A-1", 1, D1),
        lambda: wh.adjust("BOLT", "A-1", -1, D1),
        lambda: wh.transfer("BOLT", 1, "A-1", "B-1", D1),
    ):
        with pytest.raises(ValidationError, match="date order"):
            action()
    assert (wh.on_hand("BOLT"), wh.stock_value("BOLT"), len(wh.movements)) == (10, 1000, 1)
