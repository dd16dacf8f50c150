"""Reading and writing expenses as CSV.

Format (header required, columns in `CSV_COLUMNS` order):

    date,description,payer,amount,currency,split,participants,params
    2024-03-01,Groceries,alice,42.10,EUR,shares,alice|bob,alice=2;bob=1

An empty `currency` means the ledger's currency. Reading checks every row and reports all
problems at once in a `CsvImportError`, each with its line number and column.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime

from .book import Ledger
from .constants import CSV_COLUMNS, DATE_FORMAT, DEFAULT_CURRENCY, PARAM_SEPARATOR, PARTICIPANT_SEPARATOR
from .errors import LedgerError, ValidationError
from .models import Expense
from .money import Money


@dataclass(frozen=True)
class RowError:
    """One problem in a CSV file: 1-based `line` (the header is line 1) and `column`."""

    line: int
    column: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}, {self.column}: {self.message}"


class CsvImportError(LedgerError):
    """A CSV file has problems; `errors` lists all of them."""

    def __init__(self, errors: list[RowError]) -> None:
        super().__init__("; ".join(str(e) for e in errors))
        self.errors = errors


def parse_params(text: str) -> dict[str, str]:
    """`"alice=2;bob=1"` -> `{"alice": "2", "bob": "1"}`; an empty text gives `{}`."""
    params: dict[str, str] = {}
    if not text.strip():
        return params
    for pair in text.split(PARAM_SEPARATOR):
        name, sep, value = pair.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise ValidationError(f"expected name=value, got {pair!r}", field="params")
        if name in params:
            raise ValidationError(f"{name!r} is given twice", field="params")
        params[name] = value
    return params


def format_params(params: dict[str, str]) -> str:
    return PARAM_SEPARATOR.join(f"{name}={value}" for name, value in params.items())


def parse_date(text: str) -> date:
    try:
        return datetime.strptime(text.strip(), DATE_FORMAT).date()
    except ValueError:
        raise ValidationError(f"not a date (YYYY-MM-DD): {text!r}", field="date") from None


def _parse_row(row: dict[str, str], default_currency: str) -> Expense:
    currency = row["currency"].strip() or default_currency
    participants = tuple(p.strip() for p in row["participants"].split(PARTICIPANT_SEPARATOR) if p.strip())
    expense = Expense(
        description=row["description"],
        payer=row["payer"].strip(),
        amount=Money.parse(row["amount"], currency),
        participants=participants,
        on=parse_date(row["date"]),
        split=row["split"].strip() or "equal",
        params=parse_params(row["params"]),
    )
    expense.shares()
    return expense


def read_expenses(text: str, default_currency: str = DEFAULT_CURRENCY) -> list[Expense]:
    """The expenses in CSV `text`; raises `CsvImportError` listing every bad row."""
    reader = csv.DictReader(io.StringIO(text))
    header = tuple(reader.fieldnames or ())
    if header != CSV_COLUMNS:
        missing = [c for c in CSV_COLUMNS if c not in header]
        detail = f"missing columns: {', '.join(missing)}" if missing else "columns out of order or unexpected"
        raise CsvImportError([RowError(1, "header", detail)])
    expenses: list[Expense] = []
    errors: list[RowError] = []
    for index, row in enumerate(reader):
        line = index + 2
        if None in row or any(v is None for v in row.values()):
            errors.append(RowError(line, "row", f"expected {len(CSV_COLUMNS)} columns"))
            continue
        try:
            expenses.append(_parse_row(row, default_currency))
        except ValidationError as e:
            errors.append(RowError(line, e.field or "row", str(e)))
    if errors:
        raise CsvImportError(errors)
    return expenses


def write_expenses(expenses: Iterable[Expense]) -> str:
    """CSV text for `expenses` that `read_expenses` reads back to equal expenses."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for e in expenses:
        writer.writerow(
            [
                e.on.strftime(DATE_FORMAT),
                e.description,
                e.payer,
                e.amount.amount_str(),
                e.amount.currency,
                e.split,
                PARTICIPANT_SEPARATOR.join(e.participants),
                format_params(dict(e.params)),
            ]
        )
    return out.getvalue()


def import_expenses(ledger: Ledger, text: str) -> list[Expense]:
    """Adds the expenses in `text` to `ledger`: all of them, or none if any row is bad."""
    expenses = read_expenses(text, ledger.currency)
    known = {p.id for p in ledger.people}
    errors: list[RowError] = []
    for index, expense in enumerate(expenses):
        unknown = [p for p in (expense.payer, *expense.participants) if p not in known]
        if unknown:
            errors.append(RowError(index + 2, "participants", f"unknown people: {', '.join(sorted(set(unknown)))}"))
        if expense.amount.currency != ledger.currency:
            errors.append(RowError(index + 2, "currency", f"expected {ledger.currency}"))
    if errors:
        raise CsvImportError(errors)
    return [ledger.add_expense(e) for e in expenses]
