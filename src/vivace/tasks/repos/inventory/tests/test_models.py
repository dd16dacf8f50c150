from datetime import date

import pytest

from inventory.errors import (
    InsufficientStockError,
    ValidationError,
    require_non_negative,
    require_positive,
    validate_code,
)
from inventory.models import Item, Location, Movement, MovementKind
from inventory.movements import MovementLedger

D1, D2, D3 = date(2024, 1, 1), date(2024, 1, 2), date(2024, 1, 3)


def test_validate_code():
    assert validate_code("SKU-1", "SKU") == "SKU-1"
    assert validate_code("A", "SKU") == "A"
    for bad in ("sku-1", "-A", "", "A B", "A_1"):
        with pytest.raises(ValidationError, match="invalid SKU"):
            validate_code(bad, "SKU")


def test_require_positive_and_non_negative():
    assert require_positive(1) == 1
    assert require_non_negative(0, "x") == 0
    for bad in (0, -1, 1.5, True, "3"):
        with pytest.raises(ValidationError):
            require_positive(bad)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="x must be a non-negative integer, got -1"):
        require_non_negative(-1, "x")
    for bad in (-1, 0.5, False):
        with pytest.raises(ValidationError, match="x must be"):
            require_non_negative(bad, "x")  # type: ignore[arg-type]


def test_insufficient_stock_message():
    assert str(InsufficientStockError("BOLT", 5, 3)) == "BOLT: requested 5, only 3 available"
    assert str(InsufficientStockError("BOLT", 5, 3, "A-1")) == "BOLT at A-1: requested 5, only 3 available"


def test_item_and_location_validation():
    assert Item("BOLT", "Bolt").valuation == "fifo"
    with pytest.raises(ValidationError):
        Item("bolt", "Bolt")
    with pytest.raises(ValidationError, match="needs a name"):
        Item("BOLT", "  ")
    assert Location("A-1", capacity=0).capacity == 0
    with pytest.raises(ValidationError):
        Location("A-1", capacity=-1)


def move(kind, source=None, destination=None, quantity=5, unit_cost=None):
    return Movement(1, kind, "BOLT", quantity, D1, source, destination, unit_cost)


def test_movement_directions():
    move(MovementKind.RECEIPT, destination="A")
    move(MovementKind.ISSUE, source="A")
    move(MovementKind.TRANSFER, source="A", destination="B")
    move(MovementKind.ADJUSTMENT, source="A")
    move(MovementKind.ADJUSTMENT, destination="A")
    bad = [
        (MovementKind.RECEIPT, "A", None),
        (MovementKind.RECEIPT, "A", "B"),
        (MovementKind.ISSUE, None, "A"),
        (MovementKind.TRANSFER, "A", None),
        (MovementKind.TRANSFER, "A", "A"),
        (MovementKind.ADJUSTMENT, "A", "B"),
        (MovementKind.ADJUSTMENT, None, None),
    ]
    for kind, source, destination in bad:
        with pytest.raises(ValidationError):
            move(kind, source, destination)


def test_movement_quantity_and_cost_validation():
    with pytest.raises(ValidationError):
        move(MovementKind.RECEIPT, destination="A", quantity=0)
    with pytest.raises(ValidationError):
        move(MovementKind.RECEIPT, destination="A", unit_cost=-1)
    assert move(MovementKind.RECEIPT, destination="A", unit_cost=0).unit_cost == 0


def test_movement_delta():
    transfer = move(MovementKind.TRANSFER, source="A", destination="B", quantity=4)
    assert (transfer.delta("A"), transfer.delta("B"), transfer.delta("C"), transfer.delta()) == (-4, 4, 0, 0)
    receipt = move(MovementKind.RECEIPT, destination="A", quantity=4)
    assert (receipt.delta("A"), receipt.delta(), receipt.delta("B")) == (4, 4, 0)
    issue = move(MovementKind.ISSUE, source="A", quantity=4)
    assert (issue.delta("A"), issue.delta()) == (-4, -4)


@pytest.fixture
def journal() -> MovementLedger:
    ledger = MovementLedger()
    ledger.record(MovementKind.RECEIPT, "BOLT", 10, D1, destination="A", unit_cost=100)
    ledger.record(MovementKind.RECEIPT, "NUT", 7, D1, destination="A", unit_cost=5)
    ledger.record(MovementKind.TRANSFER, "BOLT", 4, D2, source="A", destination="B")
    ledger.record(MovementKind.ISSUE, "BOLT", 3, D2, source="B")
    ledger.record(MovementKind.ISSUE, "BOLT", 1, D3, source="A")
    return ledger


def test_ledger_numbers_movements_and_keeps_date_order(journal):
    assert [m.seq for m in journal] == [1, 2, 3, 4, 5]
    assert len(journal) == 5
    with pytest.raises(ValidationError, match="date order"):
        journal.record(MovementKind.ISSUE, "BOLT", 1, D2, source="A")
    assert journal.record(MovementKind.ISSUE, "BOLT", 1, D3, source="A").seq == 6


def test_ledger_on_hand(journal):
    assert journal.on_hand("BOLT") == 6
    assert journal.on_hand("BOLT", "A") == 5
    assert journal.on_hand("BOLT", "B") == 1
    assert journal.on_hand("BOLT", "C") == 0
    assert journal.on_hand("BOLT", as_of=D1) == 10
    assert journal.on_hand("BOLT", "B", as_of=D2) == 1
    assert journal.on_hand("GEAR") == 0


def test_ledger_history_and_by_location(journal):
    assert [m.seq for m in journal.history("BOLT")] == [1, 3, 4, 5]
    assert [m.seq for m in journal.history("BOLT", MovementKind.ISSUE)] == [4, 5]
    assert journal.by_location("BOLT") == {"A": 5, "B": 1}
    journal.record(MovementKind.ISSUE, "BOLT", 1, D3, source="B")
    assert journal.by_location("BOLT") == {"A": 5}
    assert journal.units_at("A") == 12
    assert journal.units_at("B") == 0


def test_ledger_issued_is_inclusive(journal):
    assert journal.issued("BOLT", D1, D3) == 4
    assert journal.issued("BOLT", D2, D2) == 3
    assert journal.issued("BOLT", D3, D3) == 1
    assert journal.issued("NUT", D1, D3) == 0
    with pytest.raises(ValidationError):
        journal.issued("BOLT", D3, D2)
