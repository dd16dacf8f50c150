"""Constants shared across the ledger package."""

from __future__ import annotations

#: Currency used when none is given.
DEFAULT_CURRENCY = "EUR"

#: Number of decimal places (minor-unit digits) of each supported currency.
CURRENCY_DECIMALS: dict[str, int] = {
    "EUR": 2,
    "USD": 2,
    "GBP": 2,
    "CHF": 2,
    "JPY": 0,
}

#: Percent splits are expressed with this many decimal places ("33.33").
PERCENT_DECIMALS = 2

#: A complete percent split adds up to this many basis points (100.00 %).
PERCENT_TOTAL_BASIS_POINTS = 100 * 10**PERCENT_DECIMALS

#: Columns of the expense CSV format, in order.
CSV_COLUMNS: tuple[str, ...] = (
    "date",
    "description",
    "payer",
    "amount",
    "currency",
    "split",
    "participants",
    "params",
)

#: Separator between participants in the CSV `participants` column ("alice|bob").
PARTICIPANT_SEPARATOR = "|"

#: Separator between `name=value` pairs in the CSV `params` column ("alice=2;bob=1").
PARAM_SEPARATOR = ";"

#: Dates are written as ISO dates.
DATE_FORMAT = "%Y-%m-%d"

#: Person ids: lower-case letters, digits and underscores, starting with a letter.
PERSON_ID_PATTERN = r"[a-z][a-z0-9_]*"
