"""Shared-expense ledger: who paid what, who owes whom, and how to settle up."""

from .book import Ledger, Transfer, apply_transfers, settle_up
from .csvio import CsvImportError, RowError, import_expenses, read_expenses, write_expenses
from .errors import CurrencyMismatchError, LedgerError, SplitError, UnknownPersonError, ValidationError
from .models import Expense, Payment, Person
from .money import Money, sum_money
from .splits import SplitStrategy, get_strategy, register, strategy_names

__all__ = [
    "CsvImportError",
    "CurrencyMismatchError",
    "Expense",
    "Ledger",
    "LedgerError",
    "Money",
    "Payment",
    "Person",
    "RowError",
    "SplitError",
    "SplitStrategy",
    "Transfer",
    "UnknownPersonError",
    "ValidationError",
    "apply_transfers",
    "get_strategy",
    "import_expenses",
    "read_expenses",
    "register",
    "settle_up",
    "strategy_names",
    "sum_money",
    "write_expenses",
]
