"""`Money`: an exact amount in integer minor units (cents) of one currency."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import total_ordering

from .constants import CURRENCY_DECIMALS, DEFAULT_CURRENCY
from .errors import CurrencyMismatchError, ValidationError

_AMOUNT = re.compile(r"^([+-]?)(\d+)(?:\.(\d+))?$")


def currency_decimals(currency: str) -> int:
    """Minor-unit digits of `currency`; raises `ValidationError` for unsupported currencies."""
    try:
        return CURRENCY_DECIMALS[currency]
    except KeyError:
        raise ValidationError(f"unsupported currency {currency!r}", field="currency") from None


@total_ordering
@dataclass(frozen=True)
class Money:
    """An amount of money: `cents` minor units of `currency`.

    Arithmetic between amounts requires the same currency; multiplying by an integer is
    allowed. Division is done with `allocate`, which never loses or invents a cent.
    """

    cents: int
    currency: str = DEFAULT_CURRENCY

    def __post_init__(self) -> None:
        if not isinstance(self.cents, int) or isinstance(self.cents, bool):
            raise ValidationError(f"cents must be an integer, got {self.cents!r}", field="amount")
        currency_decimals(self.currency)

    # -- construction -------------------------------------------------------------------

    @classmethod
    def zero(cls, currency: str = DEFAULT_CURRENCY) -> Money:
        return cls(0, currency)

    @classmethod
    def parse(cls, text: str, currency: str = DEFAULT_CURRENCY) -> Money:
        """Parses a decimal amount such as "12.5", "-3" or "1234.56" in `currency`.

        At most the currency's number of decimals may be given ("1.234" EUR is an error).
        """
        decimals = currency_decimals(currency)
        match = _AMOUNT.match(text.strip())
        if match is None:
            raise ValidationError(f"not an amount: {text!r}", field="amount")
        sign, whole, fraction = match.groups()
        fraction = fraction or ""
        if len(fraction) > decimals:
            raise ValidationError(f"too many decimals for {currency}: {text!r}", field="amount")
        cents = int(whole) * 10**decimals + int(fraction.ljust(decimals, "0") or "0")
        return cls(-cents if sign == "-" else cents, currency)

    # -- arithmetic ---------------------------------------------------------------------

    def _check(self, other: object) -> Money:
        if not isinstance(other, Money):
            raise TypeError(f"expected Money, got {type(other).__name__}")
        if other.currency != self.currency:
            raise CurrencyMismatchError(self.currency, other.currency)
        return other

    def __add__(self, other: Money) -> Money:
        return Money(self.cents + self._check(other).cents, self.currency)

    def __sub__(self, other: Money) -> Money:
        return Money(self.cents - self._check(other).cents, self.currency)

    def __neg__(self) -> Money:
        return Money(-self.cents, self.currency)

    def __abs__(self) -> Money:
        return Money(abs(self.cents), self.currency)

    def __mul__(self, factor: int) -> Money:
        if not isinstance(factor, int) or isinstance(factor, bool):
            return NotImplemented
        return Money(self.cents * factor, self.currency)

    __rmul__ = __mul__

    def __lt__(self, other: Money) -> bool:
        return self.cents < self._check(other).cents

    def is_zero(self) -> bool:
        return self.cents == 0

    def is_positive(self) -> bool:
        return self.cents > 0

    def is_negative(self) -> bool:
        return self.cents < 0

    # -- division -----------------------------------------------------------------------

    def allocate(self, weights: Sequence[int]) -> list[Money]:
        """Splits the amount in proportion to `weights`, exactly (largest remainder).

        Every part gets the floor of its exact share; the cents left over go one each to
        the parts with the largest remainders, earlier parts first on ties. The parts
        always add up to the amount. Negative amounts are split like their absolute value.
        """
        if not weights:
            raise ValidationError("cannot allocate over no weights", field="weights")
        if any(w < 0 for w in weights):
            raise ValidationError("weights must not be negative", field="weights")
        total_weight = sum(weights)
        if total_weight == 0:
            raise ValidationError("weights must not all be zero", field="weights")
        if self.cents < 0:
            return [-part for part in (-self).allocate(weights)]
        floors = [self.cents * w // total_weight for w in weights]
        remainders = [self.cents * w % total_weight for w in weights]
        left = self.cents - sum(floors)
        order = sorted(range(len(weights)), key=lambda i: (-remainders[i], i))
        for i in order[:left]:
            floors[i] += 1
        return [Money(c, self.currency) for c in floors]

    def split_evenly(self, parts: int) -> list[Money]:
        """`parts` amounts that differ by at most one cent and add up to this amount."""
        if parts < 1:
            raise ValidationError("cannot split into fewer than one part", field="parts")
        return self.allocate([1] * parts)

    # -- formatting ---------------------------------------------------------------------

    def amount_str(self) -> str:
        """The amount without currency, e.g. "-0.05" or "1200" (JPY)."""
        decimals = currency_decimals(self.currency)
        sign = "-" if self.cents < 0 else ""
        whole, fraction = divmod(abs(self.cents), 10**decimals)
        if decimals == 0:
            return f"{sign}{whole}"
        return f"{sign}{whole}.{fraction:0{decimals}d}"

    def __str__(self) -> str:
        return f"{self.amount_str()} {self.currency}"


def sum_money(amounts: Iterable[Money], currency: str = DEFAULT_CURRENCY) -> Money:
    """The sum of `amounts`; `Money.zero(currency)` when there are none."""
    total = Money.zero(currency)
    for amount in amounts:
        total = total + amount
    return total
