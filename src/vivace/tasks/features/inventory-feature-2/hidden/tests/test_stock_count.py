from datetime import date

import pytest

from inventory.errors import UnknownItemError, UnknownLocationError, ValidationError
from inventory.models import MovementKind
from inventory.warehouse import Warehouse

D1, D2 = date(2024, 5, 1), date(2024, 5, 2)


@pytest.fixture
def wh() -> Warehouse:
    w = Warehouse()
    w.add_item("BOLT", "Hex bolt")
    w.add_item("NUT", "Nut", valuation="average")
    w.add_item("GEAR", "Gear")
    w.add_location("A-1")
    w.add_location("B-1")
    w.receive("BOLT", 10, "A-1", 100, D1)
    w.receive("BOLT", 10, "A-1", 200, D1)
    w.receive("NUT", 5, "A-1", 10, D1)
    w.receive("NUT", 4, "B-1", 10, D1)
    return w


def summary(lines):
    return [(line.sku, line.expected, line.counted, line.difference) for line in lines]


def test_count_books_differences_as_adjustments(wh):
    lines = wh.count("A-1", {"NUT": 7, "BOLT": 18}, D2)
    assert summary(lines) == [("BOLT", 20, 18, -2), ("NUT", 5, 7, 2)]
    assert wh.on_hand("BOLT", "A-1") == 18
    assert wh.on_hand("NUT", "A-1") == 7
    assert wh.on_hand("NUT", "B-1") == 4
    posted = list(wh.movements)[4:]
    assert sorted((m.kind, m.sku, m.quantity, m.source, m.destination, m.reference) for m in posted) == [
        (MovementKind.ADJUSTMENT, "BOLT", 2, "A-1", None, "count"),
        (MovementKind.ADJUSTMENT, "NUT", 2, None, "A-1", "count"),
    ]


def test_matching_count_books_nothing(wh):
    lines = wh.count("A-1", {"BOLT": 20}, D2)
    assert summary(lines) == [("BOLT", 20, 20, 0)]
    assert len(wh.movements) == 4
    assert wh.count("B-1", {}, D2) == []


def test_count_uses_the_items_valuation(wh):
    wh.count("A-1", {"BOLT": 21}, D2)  # found one, at the current unit cost of 150
    assert wh.stock_value("BOLT") == 3150
    wh.count("A-1", {"BOLT": 10}, D2)  # fifo: the 11 lost units are the oldest
    assert wh.stock_value("BOLT") == 9 * 200 + 150


def test_full_count_treats_uncounted_items_as_zero(wh):
    wh.receive("GEAR", 3, "B-1", 500, D1)
    lines = wh.count("B-1", {"GEAR": 3}, D2, full=True)
    assert summary(lines) == [("GEAR", 3, 3, 0), ("NUT", 4, 0, -4)]
    assert wh.on_hand("NUT", "B-1") == 0
    assert wh.on_hand("NUT", "A-1") == 5
    assert summary(wh.count("A-1", {}, D2)) == []
    assert summary(wh.count("A-1", {}, D2, full=True)) == [("BOLT", 20, 0, -20), ("NUT", 5, 0, -5)]
    assert wh.on_hand("BOLT") == 0


def test_counting_an_item_not_at_the_location(wh):
    lines = wh.count("B-1", {"GEAR": 2}, D2)
    assert summary(lines) == [("GEAR", 0, 2, 2)]
    assert wh.on_hand("GEAR", "B-1") == 2


def test_invalid_counts_book_nothing(wh):
    with pytest.raises(UnknownItemError):
        wh.count("A-1", {"BOLT": 1, "WIDGET": 1}, D2)
    with pytest.raises(ValidationError):
        wh.count("A-1", {"BOLT": 1, "NUT": -1}, D2)
    with pytest.raises(UnknownLocationError):
        wh.count("Z-9", {"BOLT": 1}, D2)
    assert wh.on_hand("BOLT", "A-1") == 20
    assert len(wh.movements) == 4
