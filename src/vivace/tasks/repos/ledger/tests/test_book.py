from datetime import date

import pytest

from ledger.book import Ledger, Transfer, apply_transfers, settle_up
from ledger.errors import CurrencyMismatchError, LedgerError, SplitError, UnknownPersonError, ValidationError
from ledger.models import Expense, Payment, Person, validate_person_id
from ledger.money import Money

D1, D2, D3 = date(2024, 3, 1), date(2024, 3, 2), date(2024, 3, 3)


def eur(text: str) -> Money:
    return Money.parse(text)


def cents(balances: dict[str, Money]) -> dict[str, int]:
    return {name: m.cents for name, m in balances.items()}


@pytest.fixture
def group() -> Ledger:
    ledger = Ledger()
    for person in ("alice", "bob", "carol"):
        ledger.add_person(person)
    return ledger


def test_person_ids_and_names():
    assert Person("mary_ann").name == "Mary Ann"
    assert validate_person_id("bob_2") == "bob_2"
    assert Person("bob", "Robert").name == "Robert"
    for bad in ("Bob", "1bob", "", "bob smith", "bob-smith"):
        with pytest.raises(ValidationError):
            Person(bad)


def test_expense_validation():
    with pytest.raises(ValidationError, match="description"):
        Expense("  ", "alice", eur("1"), ("alice",), D1)
    with pytest.raises(ValidationError, match="positive"):
        Expense("Zero", "alice", eur("0"), ("alice",), D1)
    with pytest.raises(ValidationError):
        Expense("Bad payer", "Alice", eur("1"), ("alice",), D1)
    expense = Expense("Ok", "alice", eur("0.01"), ["alice"], D1)
    assert expense.participants == ("alice",)


def test_expense_shares_and_share_of():
    expense = Expense("Taxi", "alice", eur("10"), ("alice", "bob"), D1, "shares", {"alice": "1", "bob": "4"})
    assert cents(expense.shares()) == {"alice": 200, "bob": 800}
    assert expense.share_of("bob") == eur("8")
    assert expense.share_of("carol") == eur("0")


def test_payment_validation():
    with pytest.raises(ValidationError):
        Payment("Alice", "bob", eur("1"), D1)
    with pytest.raises(ValidationError):
        Payment("alice", "Bob", eur("1"), D1)
    with pytest.raises(ValidationError):
        Payment("alice", "alice", eur("1"), D1)
    with pytest.raises(ValidationError):
        Payment("alice", "bob", eur("0"), D1)
    assert Payment("alice", "bob", eur("0.01"), D1).amount.cents == 1


def test_people(group):
    assert [p.id for p in group.people] == ["alice", "bob", "carol"]
    assert group.person("bob").name == "Bob"
    with pytest.raises(LedgerError, match="already exists"):
        group.add_person("bob")
    with pytest.raises(UnknownPersonError) as info:
        group.person("dave")
    assert info.value.person_id == "dave"
    assert "unknown person 'dave'" in str(info.value)


def test_ledger_rejects_unknown_currency():
    with pytest.raises(ValidationError):
        Ledger("XYZ")


def test_add_expense_assigns_ids_and_validates(group):
    first = group.add_expense(Expense("Dinner", "alice", eur("30"), ("alice", "bob", "carol"), D1))
    second = group.add_expense(Expense("Taxi", "bob", eur("12"), ("bob",), D2))
    assert (first.id, second.id) == (1, 2)
    with pytest.raises(UnknownPersonError):
        group.add_expense(Expense("Gift", "alice", eur("5"), ("alice", "dave"), D1))
    with pytest.raises(UnknownPersonError):
        group.add_expense(Expense("Gift", "dave", eur("5"), ("alice",), D1))
    with pytest.raises(CurrencyMismatchError):
        group.add_expense(Expense("Gift", "alice", Money(500, "USD"), ("alice",), D1))
    with pytest.raises(SplitError):
        group.add_expense(Expense("Gift", "alice", eur("5"), ("alice", "bob"), D1, "exact", {"alice": "1", "bob": "1"}))
    assert len(group.expenses) == 2
    assert group.add_expense(Expense("Tip", "carol", eur("1"), ("carol",), D3)).id == 3


def test_get_and_remove_expense(group):
    group.add_expense(Expense("Dinner", "alice", eur("30"), ("alice", "bob", "carol"), D1))
    group.add_expense(Expense("Taxi", "bob", eur("12"), ("alice", "bob"), D2))
    assert group.get_expense(2).description == "Taxi"
    removed = group.remove_expense(1)
    assert removed.description == "Dinner"
    assert [e.id for e in group.expenses] == [2]
    with pytest.raises(LedgerError):
        group.get_expense(1)
    assert cents(group.balances()) == {"alice": -600, "bob": 600, "carol": 0}


def test_balances(group):
    group.add_expense(Expense("Dinner", "alice", eur("30"), ("alice", "bob", "carol"), D1))
    group.add_expense(Expense("Taxi", "bob", eur("12"), ("alice", "bob"), D2))
    group.add_expense(
        Expense(
            "Museum",
            "carol",
            eur("10"),
            ("alice", "bob", "carol"),
            D3,
            "shares",
            {"alice": "2", "bob": "1", "carol": "2"},
        )
    )
    assert cents(group.balances()) == {"alice": 1000, "bob": -600, "carol": -400}
    assert sum(m.cents for m in group.balances().values()) == 0
    assert group.balance_of("carol") == eur("-4")
    with pytest.raises(UnknownPersonError):
        group.balance_of("dave")


def test_payments_move_balances(group):
    group.add_expense(Expense("Dinner", "alice", eur("30"), ("alice", "bob", "carol"), D1))
    payment = group.record_payment("bob", "alice", eur("4"), D2)
    assert payment.payee == "alice"
    assert cents(group.balances()) == {"alice": 1600, "bob": -600, "carol": -1000}
    assert group.payments == [payment]
    with pytest.raises(UnknownPersonError):
        group.record_payment("bob", "dave", eur("1"), D2)
    with pytest.raises(CurrencyMismatchError):
        group.record_payment("bob", "alice", Money(100, "USD"), D2)


def test_totals(group):
    group.add_expense(Expense("Dinner", "alice", eur("30"), ("alice", "bob", "carol"), D1))
    group.add_expense(Expense("Taxi", "alice", eur("12"), ("bob", "carol"), D2))
    group.add_expense(Expense("Snack", "bob", eur("3"), ("alice",), D2))
    assert group.total_paid("alice") == eur("42")
    assert group.total_paid("bob") == eur("3")
    assert group.total_paid("carol") == eur("0")
    assert group.total_spent("alice") == eur("13")
    assert group.total_spent("bob") == eur("16")
    assert group.total_spent("carol") == eur("16")
    with pytest.raises(UnknownPersonError):
        group.total_spent("dave")
    with pytest.raises(UnknownPersonError):
        group.total_paid("dave")


def test_expenses_for_sorts_by_date_then_id(group):
    group.add_expense(Expense("Late", "alice", eur("1"), ("alice",), D3))
    group.add_expense(Expense("Early", "bob", eur("1"), ("alice", "bob"), D1))
    group.add_expense(Expense("Bob only", "bob", eur("1"), ("bob",), D1))
    group.add_expense(Expense("Early too", "carol", eur("1"), ("alice",), D1))
    assert [e.description for e in group.expenses_for("alice")] == ["Early", "Early too", "Late"]
    assert [e.description for e in group.expenses_for("carol")] == ["Early too"]
    with pytest.raises(UnknownPersonError):
        group.expenses_for("dave")


def test_expenses_between_is_inclusive(group):
    for day in (1, 2, 3, 4):
        group.add_expense(Expense(f"Day {day}", "alice", eur("1"), ("alice",), date(2024, 3, day)))
    assert [e.on.day for e in group.expenses_between(D2, D3)] == [2, 3]
    assert [e.on.day for e in group.expenses_between(D2, D2)] == [2]
    with pytest.raises(LedgerError, match="empty date range"):
        group.expenses_between(D3, D2)


def settled(balances: dict[str, int]) -> list[tuple[str, str, int]]:
    transfers = settle_up({p: Money(c) for p, c in balances.items()})
    after = apply_transfers({p: Money(c) for p, c in balances.items()}, transfers)
    assert all(m.is_zero() for m in after.values())
    return [(t.debtor, t.creditor, t.amount.cents) for t in transfers]


def test_settle_up_simple_cases():
    assert settle_up({}) == []
    assert settled({"a": 0, "b": 0}) == []
    assert settled({"a": 500, "b": -500}) == [("b", "a", 500)]
    assert settled({"a": 1000, "b": -600, "c": -400}) == [("b", "a", 600), ("c", "a", 400)]


def test_settle_up_prefers_exact_matches():
    balances = {"a": 700, "b": 300, "c": -300, "d": -700}
    assert settled(balances) == [("c", "b", 300), ("d", "a", 700)]


def test_settle_up_largest_first_and_ties_by_name():
    balances = {"a": 500, "b": 500, "c": -400, "d": -600}
    assert settled(balances) == [("d", "a", 500), ("c", "b", 400), ("d", "b", 100)]
    assert settled({"a": 500, "b": 1, "c": -501}) == [("c", "a", 500), ("c", "b", 1)]
    balances = {"x": 300, "y": 300, "z": -600}
    assert settled(balances) == [("z", "x", 300), ("z", "y", 300)]


def test_settle_up_uses_at_most_n_minus_one_transfers():
    balances = {"a": 1234, "b": 766, "c": -1, "d": -999, "e": -1000}
    result = settled(balances)
    assert len(result) <= 4
    assert sum(amount for _, _, amount in result) == 2000


def test_settle_up_rejects_unbalanced_input():
    with pytest.raises(LedgerError, match="add up to zero"):
        settle_up({"a": Money(100), "b": Money(-99)})


def test_apply_transfers():
    balances = {"a": Money(100), "b": Money(-100)}
    after = apply_transfers(balances, [Transfer("b", "a", Money(40))])
    assert after == {"a": Money(60), "b": Money(-60)}
    assert balances["a"] == Money(100)
    with pytest.raises(LedgerError):
        apply_transfers(balances, [Transfer("b", "z", Money(40))])
    assert str(Transfer("b", "a", Money(40))) == "b -> a: 0.40 EUR"


def test_ledger_settle_up_end_to_end(group):
    group.add_expense(Expense("Dinner", "alice", eur("30"), ("alice", "bob", "carol"), D1))
    group.add_expense(Expense("Taxi", "bob", eur("12"), ("alice", "bob"), D2))
    transfers = group.settle_up()
    assert [(t.debtor, t.creditor, t.amount) for t in transfers] == [
        ("carol", "alice", eur("10")),
        ("bob", "alice", eur("4")),
    ]
    for t in transfers:
        group.record_payment(t.debtor, t.creditor, t.amount, D3)
    assert all(b.is_zero() for b in group.balances().values())
    assert group.settle_up() == []
