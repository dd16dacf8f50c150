from datetime import date

import pytest

from ledger.book import Ledger
from ledger.errors import UnknownPersonError
from ledger.models import Expense
from ledger.money import Money


def eur(text: str) -> Money:
    return Money.parse(text)


def rows(lines):
    return [(line.on.day, line.description, line.change.cents, line.balance.cents) for line in lines]


@pytest.fixture
def group() -> Ledger:
    ledger = Ledger()
    for person in ("alice", "bob", "carol"):
        ledger.add_person(person)
    ledger.add_expense(Expense("Hotel", "alice", eur("90"), ("alice", "bob", "carol"), date(2024, 6, 3)))
    ledger.add_expense(Expense("Train", "bob", eur("40"), ("alice", "bob"), date(2024, 6, 1)))
    ledger.add_expense(
        Expense("Museum", "carol", eur("9"), ("bob", "carol"), date(2024, 6, 3), "shares", {"bob": "2", "carol": "1"})
    )
    ledger.record_payment("bob", "alice", eur("5"), date(2024, 6, 2))
    return ledger


def test_statement_is_chronological_with_running_balance(group):
    assert rows(group.statement("alice")) == [
        (1, "Train", -2000, -2000),
        (2, "Payment from bob", -500, -2500),
        (3, "Hotel", 6000, 3500),
    ]


def test_statement_for_payer_and_participant(group):
    assert rows(group.statement("bob")) == [
        (1, "Train", 2000, 2000),
        (2, "Payment to alice", 500, 2500),
        (3, "Hotel", -3000, -500),
        (3, "Museum", -600, -1100),
    ]
    assert rows(group.statement("carol")) == [
        (3, "Hotel", -3000, -3000),
        (3, "Museum", 600, -2400),
    ]


def test_statement_ends_at_the_current_balance(group):
    for person in ("alice", "bob", "carol"):
        lines = group.statement(person)
        assert lines[-1].balance == group.balance_of(person)
        assert all(isinstance(line.change, Money) and isinstance(line.balance, Money) for line in lines)


def test_same_day_expenses_before_payments_in_recorded_order():
    ledger = Ledger()
    ledger.add_person("alice")
    ledger.add_person("bob")
    day = date(2024, 7, 1)
    ledger.record_payment("alice", "bob", eur("1"), day)
    ledger.add_expense(Expense("Lunch", "bob", eur("10"), ("alice", "bob"), day))
    ledger.add_expense(Expense("Coffee", "alice", eur("4"), ("alice", "bob"), day))
    ledger.record_payment("bob", "alice", eur("2"), day)
    assert [line.description for line in ledger.statement("alice")] == [
        "Lunch",
        "Coffee",
        "Payment to bob",
        "Payment from bob",
    ]
    assert [line.balance.cents for line in ledger.statement("alice")] == [-500, -300, -200, -400]


def test_statement_of_someone_without_entries_and_unknown_people(group):
    group.add_person("dave")
    assert group.statement("dave") == []
    with pytest.raises(UnknownPersonError):
        group.statement("erin")


def test_expense_paid_only_for_oneself_shows_no_change():
    ledger = Ledger("USD")
    ledger.add_person("alice")
    ledger.add_expense(Expense("Book", "alice", Money(1250, "USD"), ("alice",), date(2024, 1, 1)))
    (line,) = ledger.statement("alice")
    assert (line.description, line.change, line.balance) == ("Book", Money(0, "USD"), Money(0, "USD"))
