from datetime import date

import pytest

from ledger.book import Ledger
from ledger.csvio import CsvImportError, read_expenses, write_expenses
from ledger.errors import SplitError
from ledger.models import Expense
from ledger.money import Money
from ledger.splits import get_strategy, strategy_names

HEADER = "date,description,payer,amount,currency,split,participants,params\n"


def cents(parts):
    return {name: m.cents for name, m in parts.items()}


def test_adjustment_is_a_registered_split():
    assert "adjustment" in strategy_names()
    assert get_strategy("adjustment").name == "adjustment"


def test_adjustment_split_example_from_the_request():
    parts = get_strategy("adjustment").split(Money(10000), ["alice", "bob", "carol"], {"alice": "10"})
    assert cents(parts) == {"alice": 4000, "bob": 3000, "carol": 3000}
    assert list(parts) == ["alice", "bob", "carol"]


def test_negative_adjustments_and_leftover_cents():
    adjustment = get_strategy("adjustment")
    # rest = 10.00 - 1.00 + 2.50 = 11.50 -> 3.84, 3.83, 3.83
    parts = adjustment.split(Money(1000), ["a", "b", "c"], {"a": "1", "b": "-2.50"})
    assert cents(parts) == {"a": 484, "b": 133, "c": 383}
    assert sum(cents(parts).values()) == 1000


def test_without_adjustments_it_is_an_equal_split():
    adjustment = get_strategy("adjustment")
    assert cents(adjustment.split(Money(1000), ["a", "b", "c"])) == {"a": 334, "b": 333, "c": 333}
    assert cents(adjustment.split(Money(1000), ["a", "b"], {"a": "0"})) == {"a": 500, "b": 500}
    # adjustments may use up the whole amount
    assert cents(adjustment.split(Money(1000), ["a", "b"], {"a": "6", "b": "4"})) == {"a": 600, "b": 400}


def test_invalid_adjustments_are_rejected():
    adjustment = get_strategy("adjustment")
    with pytest.raises(SplitError):
        adjustment.split(Money(1000), ["a", "b"], {"a": "ten"})
    with pytest.raises(SplitError):
        adjustment.split(Money(1000), ["a", "b"], {"a": "1.234"})
    with pytest.raises(SplitError):
        adjustment.split(Money(1000), ["a", "b"], {"z": "1"})
    with pytest.raises(SplitError):
        adjustment.split(Money(1000), ["a", "b"], {"a": "6", "b": "4.01"})
    with pytest.raises(SplitError):
        adjustment.split(Money(1000), ["a", "b"], {"a": "-12"})  # 11.00 each, then a: -1.00


def test_adjustment_split_in_the_ledger_and_csv():
    ledger = Ledger()
    for person in ("alice", "bob", "carol"):
        ledger.add_person(person)
    expense = Expense(
        "Dinner", "bob", Money(9000), ("alice", "bob", "carol"), date(2024, 5, 1), "adjustment", {"alice": "15"}
    )
    ledger.add_expense(expense)
    assert cents(ledger.balances()) == {"alice": -4000, "bob": 6500, "carol": -2500}
    text = write_expenses(ledger.expenses)
    assert "adjustment" in text
    (again,) = read_expenses(text)
    assert cents(again.shares()) == {"alice": 4000, "bob": 2500, "carol": 2500}
    rows = HEADER + "2024-05-02,Wine,alice,20,EUR,adjustment,alice|bob,bob=30\n"
    with pytest.raises(CsvImportError) as info:
        read_expenses(rows)
    assert [e.line for e in info.value.errors] == [2]
