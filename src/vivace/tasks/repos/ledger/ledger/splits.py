"""Split strategies: how an expense's amount is divided among its participants.

Each strategy is a `SplitStrategy` subclass registered under a name with `@register`;
`get_strategy(name)` looks one up. `SplitStrategy.split` is a template method: it checks
the participants and parameters, lets the subclass `compute` the parts, and checks that
the parts add up to the amount. Parameters are the raw strings of the CSV `params`
column (`{"alice": "2", "bob": "1"}`), parsed by each strategy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import ClassVar

from .constants import PERCENT_DECIMALS, PERCENT_TOTAL_BASIS_POINTS
from .errors import SplitError, ValidationError
from .money import Money, sum_money

_REGISTRY: dict[str, SplitStrategy] = {}


def register(cls: type[SplitStrategy]) -> type[SplitStrategy]:
    """Class decorator: makes the strategy available under `cls.name`."""
    if cls.name in _REGISTRY:
        raise ValueError(f"split strategy {cls.name!r} is already registered")
    _REGISTRY[cls.name] = cls()
    return cls


def get_strategy(name: str) -> SplitStrategy:
    """The strategy registered as `name`; raises `SplitError` for unknown names."""
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(strategy_names())
        raise SplitError(f"unknown split {name!r} (known: {known})") from None


def strategy_names() -> list[str]:
    """Names of all registered strategies, sorted."""
    return sorted(_REGISTRY)


class SplitStrategy(ABC):
    """Divides an amount among participants."""

    #: Name the strategy is registered under (and written in CSV files).
    name: ClassVar[str]
    #: Whether every participant must have a parameter.
    requires_params: ClassVar[bool] = True

    def split(
        self, total: Money, participants: Sequence[str], params: Mapping[str, str] | None = None
    ) -> dict[str, Money]:
        """Each participant's part of `total`, in participant order; the parts add up to `total`."""
        people = list(participants)
        if not people:
            raise SplitError("an expense needs at least one participant")
        if len(set(people)) != len(people):
            raise SplitError("participants must not repeat")
        if total.is_negative():
            raise SplitError("cannot split a negative amount")
        given = dict(params or {})
        self.validate_params(people, given)
        parts = self.compute(total, people, given)
        if sum_money(parts.values(), total.currency) != total:
            raise SplitError(f"the parts do not add up to {total}")
        return parts

    def validate_params(self, participants: list[str], params: dict[str, str]) -> None:
        """Checks that parameters name only participants (and all of them, if required)."""
        unknown = sorted(set(params) - set(participants))
        if unknown:
            raise SplitError(f"parameters for non-participants: {', '.join(unknown)}")
        if self.requires_params:
            missing = [p for p in participants if p not in params]
            if missing:
                raise SplitError(f"missing {self.name} parameter for: {', '.join(missing)}")

    @abstractmethod
    def compute(self, total: Money, participants: list[str], params: dict[str, str]) -> dict[str, Money]:
        """The parts; `participants` and `params` have been validated."""


def parse_int_param(person: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise SplitError(f"{person}: not a whole number: {value!r}") from None


def parse_percent(person: str, value: str) -> int:
    """A percentage ("12.5") in basis points of `PERCENT_DECIMALS` digits (1250)."""
    try:
        number = Decimal(value.strip())
    except InvalidOperation:
        raise SplitError(f"{person}: not a percentage: {value!r}") from None
    scaled = number * 10**PERCENT_DECIMALS
    if scaled != scaled.to_integral_value():
        raise SplitError(f"{person}: at most {PERCENT_DECIMALS} decimals in a percentage: {value!r}")
    return int(scaled)


@register
class EqualSplit(SplitStrategy):
    """Everyone pays the same; leftover cents go to the first participants."""

    name = "equal"
    requires_params = False

    def validate_params(self, participants: list[str], params: dict[str, str]) -> None:
        if params:
            raise SplitError("an equal split takes no parameters")

    def compute(self, total: Money, participants: list[str], params: dict[str, str]) -> dict[str, Money]:
        return dict(zip(participants, total.split_evenly(len(participants)), strict=True))


@register
class SharesSplit(SplitStrategy):
    """Parts proportional to whole-number shares ("alice=2;bob=1")."""

    name = "shares"

    def compute(self, total: Money, participants: list[str], params: dict[str, str]) -> dict[str, Money]:
        shares = [parse_int_param(p, params[p]) for p in participants]
        if any(s < 0 for s in shares):
            raise SplitError("shares must not be negative")
        if sum(shares) == 0:
            raise SplitError("at least one share must be positive")
        return dict(zip(participants, total.allocate(shares), strict=True))


@register
class ExactSplit(SplitStrategy):
    """Each participant's exact amount is given; the amounts must add up to the total."""

    name = "exact"

    def compute(self, total: Money, participants: list[str], params: dict[str, str]) -> dict[str, Money]:
        parts: dict[str, Money] = {}
        for person in participants:
            try:
                amount = Money.parse(params[person], total.currency)
            except ValidationError as e:
                raise SplitError(f"{person}: {e}") from None
            if amount.is_negative():
                raise SplitError(f"{person}: an exact part must not be negative")
            parts[person] = amount
        given = sum_money(parts.values(), total.currency)
        if given != total:
            raise SplitError(f"exact parts add up to {given}, not {total}")
        return parts


@register
class PercentSplit(SplitStrategy):
    """Parts by percentage ("alice=60;bob=40"); percentages must add up to exactly 100."""

    name = "percent"

    def compute(self, total: Money, participants: list[str], params: dict[str, str]) -> dict[str, Money]:
        points = [parse_percent(p, params[p]) for p in participants]
        if any(p < 0 for p in points):
            raise SplitError("percentages must not be negative")
        if sum(points) != PERCENT_TOTAL_BASIS_POINTS:
            raise SplitError(f"percentages add up to {Decimal(sum(points)).scaleb(-PERCENT_DECIMALS)}, not 100")
        return dict(zip(participants, total.allocate(points), strict=True))
