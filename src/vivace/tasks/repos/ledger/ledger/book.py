"""`Ledger`: a group's people, expenses and payments, who owes whom, and how to settle up."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import date

from .constants import DEFAULT_CURRENCY
from .errors import CurrencyMismatchError, LedgerError, UnknownPersonError
from .models import Expense, Payment, Person
from .money import Money, currency_decimals, sum_money


@dataclass(frozen=True)
class Transfer:
    """`debtor` pays `creditor` `amount`."""

    debtor: str
    creditor: str
    amount: Money

    def __str__(self) -> str:
        return f"{self.debtor} -> {self.creditor}: {self.amount}"


def settle_up(balances: Mapping[str, Money]) -> list[Transfer]:
    """Transfers that settle `balances` (positive: is owed; they must add up to zero).

    First every debtor who owes exactly what some creditor is owed pays that creditor;
    then the largest remaining debtor repeatedly pays the largest remaining creditor as
    much as possible. Ties are broken by person id, so the result is deterministic. The
    result has at most one transfer fewer than the number of people with a balance.
    """
    if not balances:
        return []
    currency = next(iter(balances.values())).currency
    if not sum_money(balances.values(), currency).is_zero():
        raise LedgerError("balances do not add up to zero")
    creditors = {p: b.cents for p, b in balances.items() if b.is_positive()}
    debtors = {p: -b.cents for p, b in balances.items() if b.is_negative()}
    transfers: list[Transfer] = []

    for debtor in sorted(debtors):
        match = next((c for c in sorted(creditors) if creditors[c] == debtors[debtor]), None)
        if match is not None:
            transfers.append(Transfer(debtor, match, Money(debtors[debtor], currency)))
            del creditors[match]
            debtors[debtor] = 0

    debtors = {p: c for p, c in debtors.items() if c > 0}
    while debtors and creditors:
        debtor = max(sorted(debtors), key=lambda p: debtors[p])
        creditor = max(sorted(creditors), key=lambda p: creditors[p])
        amount = min(debtors[debtor], creditors[creditor])
        transfers.append(Transfer(debtor, creditor, Money(amount, currency)))
        debtors[debtor] -= amount
        creditors[creditor] -= amount
        if debtors[debtor] == 0:
            del debtors[debtor]
        if creditors[creditor] == 0:
            del creditors[creditor]
    return transfers


def apply_transfers(balances: Mapping[str, Money], transfers: Iterable[Transfer]) -> dict[str, Money]:
    """The balances after `transfers` are paid (a paying debtor's balance goes up)."""
    result = dict(balances)
    for t in transfers:
        if t.debtor not in result or t.creditor not in result:
            raise LedgerError(f"transfer between unknown people: {t}")
        result[t.debtor] = result[t.debtor] + t.amount
        result[t.creditor] = result[t.creditor] - t.amount
    return result


class Ledger:
    """A shared-expense ledger in one currency.

    A positive balance means the group owes that person money; a negative balance means
    the person owes the group. Balances always add up to zero.
    """

    def __init__(self, currency: str = DEFAULT_CURRENCY) -> None:
        currency_decimals(currency)  # validates the currency
        self.currency = currency
        self._people: dict[str, Person] = {}
        self._expenses: list[Expense] = []
        self._payments: list[Payment] = []
        self._next_id = 1

    # -- people -------------------------------------------------------------------------

    def add_person(self, person_id: str, name: str = "") -> Person:
        if person_id in self._people:
            raise LedgerError(f"person {person_id!r} already exists")
        person = Person(person_id, name)
        self._people[person_id] = person
        return person

    def person(self, person_id: str) -> Person:
        try:
            return self._people[person_id]
        except KeyError:
            raise UnknownPersonError(person_id) from None

    @property
    def people(self) -> list[Person]:
        """People in the order they were added."""
        return list(self._people.values())

    def _require_known(self, person_ids: Iterable[str]) -> None:
        for person_id in person_ids:
            self.person(person_id)

    # -- records ------------------------------------------------------------------------

    @property
    def expenses(self) -> list[Expense]:
        return list(self._expenses)

    @property
    def payments(self) -> list[Payment]:
        return list(self._payments)

    def add_expense(self, expense: Expense) -> Expense:
        """Adds `expense` after checking its currency, people and split; assigns its id."""
        if expense.amount.currency != self.currency:
            raise CurrencyMismatchError(self.currency, expense.amount.currency)
        self._require_known([expense.payer, *expense.participants])
        expense.shares()  # raises SplitError if the split is invalid
        expense.id = self._next_id
        self._next_id += 1
        self._expenses.append(expense)
        return expense

    def get_expense(self, expense_id: int) -> Expense:
        for expense in self._expenses:
            if expense.id == expense_id:
                return expense
        raise LedgerError(f"no expense with id {expense_id}")

    def remove_expense(self, expense_id: int) -> Expense:
        expense = self.get_expense(expense_id)
        self._expenses.remove(expense)
        return expense

    def record_payment(self, payer: str, payee: str, amount: Money, on: date) -> Payment:
        """Records that `payer` paid `payee` (typically to settle up)."""
        if amount.currency != self.currency:
            raise CurrencyMismatchError(self.currency, amount.currency)
        self._require_known([payer, payee])
        payment = Payment(payer, payee, amount, on)
        self._payments.append(payment)
        return payment

    # -- queries ------------------------------------------------------------------------

    def balances(self) -> dict[str, Money]:
        """Every person's balance, in the order people were added."""
        result = {person_id: Money.zero(self.currency) for person_id in self._people}
        for expense in self._expenses:
            result[expense.payer] += expense.amount
            for person_id, share in expense.shares().items():
                result[person_id] -= share
        for payment in self._payments:
            result[payment.payer] += payment.amount
            result[payment.payee] -= payment.amount
        return result

    def balance_of(self, person_id: str) -> Money:
        self.person(person_id)
        return self.balances()[person_id]

    def total_paid(self, person_id: str) -> Money:
        """What `person_id` paid for expenses (payments excluded)."""
        self.person(person_id)
        return sum_money((e.amount for e in self._expenses if e.payer == person_id), self.currency)

    def total_spent(self, person_id: str) -> Money:
        """`person_id`'s share of all expenses: what they consumed."""
        self.person(person_id)
        return sum_money((e.share_of(person_id) for e in self._expenses), self.currency)

    def expenses_for(self, person_id: str) -> list[Expense]:
        """Expenses `person_id` paid for or takes part in, by date then id."""
        self.person(person_id)
        mine = [e for e in self._expenses if e.payer == person_id or person_id in e.participants]
        return sorted(mine, key=lambda e: (e.on, e.id or 0))

    def expenses_between(self, start: date, end: date) -> list[Expense]:
        """Expenses dated from `start` to `end`, both included, by date then id."""
        if end < start:
            raise LedgerError(f"empty date range: {start} to {end}")
        chosen = [e for e in self._expenses if start <= e.on <= end]
        return sorted(chosen, key=lambda e: (e.on, e.id or 0))

    def settle_up(self) -> list[Transfer]:
        """The transfers that would settle the current balances (see `settle_up`)."""
        return settle_up(self.balances())
