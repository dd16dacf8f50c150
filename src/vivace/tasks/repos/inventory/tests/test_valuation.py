import pytest

from inventory.errors import InsufficientStockError, ValidationError
from inventory.valuation import (
    AverageCostValuation,
    FIFOValuation,
    ValuationMethod,
    create_valuation,
    method_names,
    register_method,
    round_half_up,
)


def test_round_half_up():
    assert round_half_up(10, 4) == 3  # 2.5
    assert round_half_up(9, 4) == 2  # 2.25
    assert round_half_up(11, 4) == 3  # 2.75
    assert round_half_up(8, 4) == 2
    assert round_half_up(-10, 4) == -3
    assert round_half_up(-9, 4) == -2
    assert round_half_up(0, 7) == 0
    with pytest.raises(ValidationError):
        round_half_up(1, 0)


def test_registry():
    assert {"fifo", "average"} <= set(method_names())
    assert isinstance(create_valuation("fifo", "BOLT"), FIFOValuation)
    assert create_valuation("average").name == "average"
    with pytest.raises(ValidationError, match="unknown valuation method 'magic'"):
        create_valuation("magic")

    class Dup(FIFOValuation):
        name = "fifo"

    with pytest.raises(ValueError):
        register_method(Dup)


def test_fifo_issues_oldest_layers_first():
    fifo = FIFOValuation("BOLT")
    fifo.receive(10, 100)
    fifo.receive(5, 130)
    assert (fifo.quantity, fifo.value) == (15, 1650)
    assert fifo.issue(4) == 400
    assert fifo.issue(7) == 6 * 100 + 1 * 130
    assert (fifo.quantity, fifo.value) == (4, 520)
    assert [(layer.quantity, layer.unit_cost) for layer in fifo.layers] == [(4, 130)]
    assert fifo.issue(4) == 520
    assert fifo.layers == [] and fifo.value == 0


def test_fifo_exact_layer_boundary():
    fifo = FIFOValuation()
    fifo.receive(3, 10)
    fifo.receive(3, 20)
    assert fifo.issue(3) == 30
    assert len(fifo.layers) == 1
    assert fifo.issue(1) == 20


def test_average_cost():
    avg = AverageCostValuation("BOLT")
    avg.receive(10, 100)
    avg.receive(5, 130)
    assert (avg.quantity, avg.value, avg.unit_cost) == (15, 1650, 110)
    assert avg.issue(3) == 330
    assert (avg.quantity, avg.value) == (12, 1320)


def test_average_cost_rounding_and_last_units():
    avg = AverageCostValuation()
    avg.receive(3, 100)
    avg.receive(1, 101)  # 401 for 4 units
    assert avg.unit_cost == 100
    assert avg.issue(2) == 201  # 200.5 rounds up
    assert avg.value == 200
    assert avg.issue(2) == 200  # the last units take all that is left
    assert (avg.quantity, avg.value, avg.unit_cost) == (0, 0, 0)


def test_unit_cost_rounds_half_up():
    fifo = FIFOValuation()
    fifo.receive(1, 10)
    fifo.receive(1, 11)
    assert fifo.unit_cost == 11  # 10.5
    fifo.receive(1, 10)
    assert fifo.unit_cost == 10  # 10.33


def test_issue_and_receive_validation():
    for method in ("fifo", "average"):
        valuation = create_valuation(method, "BOLT")
        valuation.receive(5, 10)
        with pytest.raises(InsufficientStockError) as info:
            valuation.issue(6)
        assert (info.value.requested, info.value.available) == (6, 5)
        assert valuation.issue(5) == 50
        with pytest.raises(ValidationError):
            valuation.issue(0)
        with pytest.raises(ValidationError):
            valuation.receive(0, 10)
        with pytest.raises(ValidationError):
            valuation.receive(1, -10)
        valuation.receive(1, 0)
        assert valuation.quantity == 1 and valuation.value == 0


def test_base_class_is_abstract():
    with pytest.raises(TypeError):
        ValuationMethod()  # type: ignore[abstract]
