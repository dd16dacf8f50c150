from datetime import date

import pytest

from ledger.book import Ledger
from ledger.csvio import (
    CsvImportError,
    RowError,
    format_params,
    import_expenses,
    parse_date,
    parse_params,
    read_expenses,
    write_expenses,
)
from ledger.errors import ValidationError
from ledger.models import Expense
from ledger.money import Money

HEADER = "date,description,payer,amount,currency,split,participants,params\n"


def test_parse_params():
    assert parse_params("") == {}
    assert parse_params("  ") == {}
    assert parse_params("alice=2;bob=1") == {"alice": "2", "bob": "1"}
    assert parse_params(" alice = 2 ; bob=1 ") == {"alice": "2", "bob": "1"}
    with pytest.raises(ValidationError, match="expected name=value, got 'bob'"):
        parse_params("alice=1;bob")
    for bad in ("alice", "alice=", "=2", "alice=1;alice=2", "alice=1;"):
        with pytest.raises(ValidationError) as info:
            parse_params(bad)
        assert info.value.field == "params"


def test_format_params_round_trips():
    assert format_params({}) == ""
    assert format_params({"alice": "2", "bob": "1"}) == "alice=2;bob=1"
    assert parse_params(format_params({"a": "33.33", "b": "66.67"})) == {"a": "33.33", "b": "66.67"}


def test_parse_date():
    assert parse_date("2024-02-29") == date(2024, 2, 29)
    with pytest.raises(ValidationError):
        parse_date("2023-02-29")
    with pytest.raises(ValidationError):
        parse_date("01/03/2024")


def test_read_expenses():
    text = HEADER + (
        "2024-03-01,Groceries,alice,42.10,EUR,shares,alice|bob,alice=2;bob=1\n"
        '2024-03-02,"Pizza, large",bob,18,,,alice|bob|carol,\n'
        "2024-03-03,Hotel,carol,100,USD,exact,carol | alice,carol=60;alice=40\n"
    )
    first, second, third = read_expenses(text)
    assert first.on == date(2024, 3, 1)
    assert first.amount == Money(4210, "EUR")
    assert first.split == "shares" and first.params == {"alice": "2", "bob": "1"}
    assert first.participants == ("alice", "bob")
    assert second.description == "Pizza, large"
    assert second.split == "equal" and second.params == {}
    assert second.amount == Money(1800, "EUR")
    assert third.amount == Money(10000, "USD")
    assert third.participants == ("carol", "alice")
    assert read_expenses(HEADER + "2024-03-02,Pizza,bob,18,,,bob,\n", "GBP")[0].amount.currency == "GBP"


def test_read_expenses_empty_file_with_header():
    assert read_expenses(HEADER) == []


def test_read_expenses_checks_header():
    with pytest.raises(CsvImportError) as info:
        read_expenses("date,description,payer,amount\n")
    assert info.value.errors == [RowError(1, "header", "missing columns: currency, split, participants, params")]
    with pytest.raises(CsvImportError) as info:
        read_expenses("description,date,payer,amount,currency,split,participants,params\n")
    assert "out of order" in info.value.errors[0].message
    with pytest.raises(CsvImportError):
        read_expenses("")


def test_read_expenses_reports_every_bad_row():
    text = HEADER + (
        "2024-03-01,Ok,alice,1,EUR,equal,alice,\n"
        "2024-13-01,Bad date,alice,1,EUR,equal,alice,\n"
        "2024-03-01,Bad amount,alice,1.234,EUR,equal,alice,\n"
        "2024-03-01,Bad split,alice,1,EUR,thirds,alice,\n"
        "2024-03-01,Too short,alice,1\n"
        "2024-03-01,Bad percent,alice,10,EUR,percent,alice|bob,alice=50;bob=49\n"
        "2024-03-01,,alice,1,EUR,equal,alice,\n"
    )
    with pytest.raises(CsvImportError) as info:
        read_expenses(text)
    errors = info.value.errors
    assert [(e.line, e.column) for e in errors] == [
        (3, "date"),
        (4, "amount"),
        (5, "split"),
        (6, "row"),
        (7, "split"),
        (8, "description"),
    ]
    assert str(errors[0]).startswith("line 3, date: ")
    assert "line 4, amount" in str(info.value)


def test_write_then_read_round_trips():
    expenses = [
        Expense(
            "Groceries", "alice", Money(4210), ("alice", "bob"), date(2024, 3, 1), "shares", {"alice": "2", "bob": "1"}
        ),
        Expense("Pizza, large", "bob", Money(1805), ("alice", "bob", "carol"), date(2024, 3, 2)),
        Expense("Sushi", "carol", Money(3000, "JPY"), ("carol",), date(2024, 3, 3)),
    ]
    text = write_expenses(expenses)
    lines = text.splitlines()
    assert lines[0] == HEADER.strip()
    assert lines[1] == "2024-03-01,Groceries,alice,42.10,EUR,shares,alice|bob,alice=2;bob=1"
    assert lines[2] == '2024-03-02,"Pizza, large",bob,18.05,EUR,equal,alice|bob|carol,'
    assert lines[3] == "2024-03-03,Sushi,carol,3000,JPY,equal,carol,"
    assert read_expenses(text) == expenses


def test_import_expenses_into_ledger():
    ledger = Ledger()
    for person in ("alice", "bob"):
        ledger.add_person(person)
    text = HEADER + "2024-03-01,Groceries,alice,30,,shares,alice|bob,alice=1;bob=2\n2024-03-02,Taxi,bob,5,EUR,,bob,\n"
    added = import_expenses(ledger, text)
    assert [e.id for e in added] == [1, 2]
    assert ledger.balance_of("alice") == Money(2000)
    assert ledger.balance_of("bob") == Money(-2000)


def test_import_expenses_is_all_or_nothing():
    ledger = Ledger()
    ledger.add_person("alice")
    text = HEADER + (
        "2024-03-01,Ok,alice,1,EUR,equal,alice,\n"
        "2024-03-01,Stranger,alice,1,EUR,equal,alice|zoe,\n"
        "2024-03-01,Dollars,alice,1,USD,equal,alice,\n"
    )
    with pytest.raises(CsvImportError) as info:
        import_expenses(ledger, text)
    assert [(e.line, e.column) for e in info.value.errors] == [(3, "participants"), (4, "currency")]
    assert "unknown people: zoe" in info.value.errors[0].message
    assert ledger.expenses == []
