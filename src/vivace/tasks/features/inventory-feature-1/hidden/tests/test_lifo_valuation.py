from datetime import date

import pytest

from inventory.errors import InsufficientStockError
from inventory.valuation import create_valuation, method_names
from inventory.warehouse import Warehouse

D1, D2, D3 = date(2024, 4, 1), date(2024, 4, 2), date(2024, 4, 3)


def test_lifo_is_a_registered_method():
    assert "lifo" in method_names()
    valuation = create_valuation("lifo", "BOLT")
    assert valuation.name == "lifo"
    assert (valuation.quantity, valuation.value, valuation.unit_cost) == (0, 0, 0)


def test_lifo_issues_newest_receipts_first():
    lifo = create_valuation("lifo", "BOLT")
    lifo.receive(10, 100)
    lifo.receive(5, 130)
    assert (lifo.quantity, lifo.value) == (15, 1650)
    assert lifo.issue(3) == 390
    assert lifo.issue(4) == 2 * 130 + 2 * 100
    assert (lifo.quantity, lifo.value) == (8, 800)
    lifo.receive(2, 90)
    assert lifo.issue(3) == 2 * 90 + 100
    assert (lifo.quantity, lifo.value) == (7, 700)


def test_lifo_exact_layer_and_everything():
    lifo = create_valuation("lifo")
    lifo.receive(3, 10)
    lifo.receive(3, 20)
    assert lifo.issue(3) == 60
    assert lifo.value == 30
    assert lifo.issue(3) == 30
    assert (lifo.quantity, lifo.value) == (0, 0)


def test_lifo_cannot_issue_more_than_on_hand():
    lifo = create_valuation("lifo", "BOLT")
    lifo.receive(2, 10)
    with pytest.raises(InsufficientStockError):
        lifo.issue(3)
    assert lifo.value == 20


def test_warehouse_items_can_use_lifo():
    wh = Warehouse()
    assert wh.add_item("BOLT", "Hex bolt", valuation="lifo").valuation == "lifo"
    wh.add_item("NUT", "Nut")
    wh.add_location("A-1")
    wh.receive("BOLT", 10, "A-1", 100, D1)
    wh.receive("NUT", 10, "A-1", 100, D1)
    wh.receive("BOLT", 10, "A-1", 200, D2)
    wh.receive("NUT", 10, "A-1", 200, D2)
    assert wh.issue("BOLT", 15, "A-1", D3).unit_cost == 167  # (10*200 + 5*100) / 15
    assert wh.issue("NUT", 15, "A-1", D3).unit_cost == 133  # fifo is unchanged
    assert wh.stock_value("BOLT") == 500
    assert wh.stock_value("NUT") == 1000
    wh.adjust("BOLT", "A-1", 1, D3, unit_cost=50)
    assert wh.adjust("BOLT", "A-1", -2, D3).unit_cost == 75
    assert wh.stock_value("BOLT") == 400
