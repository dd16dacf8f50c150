"""Fare rules: what a journey costs, in integer cents.

Each kind of rule is a `FareRule` subclass registered by name with `@register_fare`.
Its `parameters` say how each constructor argument is written in a fare spec, the text
form used in configuration files:

    flat price=2.40
    zone base=2.00 per_zone=0.80
    distance base=1.20 per_km=0.15 cap=6.00

`parse_fare` reads a spec and `FareRule.spec` writes one back. Walking costs nothing: a
journey without rides is free under every rule.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from decimal import Decimal, InvalidOperation
from typing import ClassVar

from .errors import FareError
from .planner import Journey, RideLeg

_RULES: dict[str, type[FareRule]] = {}


def register_fare(cls: type[FareRule]) -> type[FareRule]:
    """Class decorator: makes the rule available under `cls.name`."""
    if cls.name in _RULES:
        raise ValueError(f"fare rule {cls.name} is already registered")
    _RULES[cls.name] = cls
    return cls


def fare_names() -> list[str]:
    return sorted(_RULES)


def get_fare_class(name: str) -> type[FareRule]:
    try:
        return _RULES[name.lower()]
    except KeyError:
        raise FareError(f"unknown fare rule {name!r} (known: {', '.join(fare_names())})") from None


def parse_price(text: str) -> int:
    """Cents for a decimal amount such as "2.40" or "3"; at most two decimals."""
    try:
        amount = Decimal(text.strip())
    except InvalidOperation:
        raise FareError(f"invalid price {text!r}") from None
    if not amount.is_finite() or amount < 0 or amount.as_tuple().exponent < -2:
        raise FareError(f"invalid price {text!r}")
    return int(amount * 100)


def format_price(cents: int) -> str:
    sign = "-" if cents < 0 else ""
    whole, rest = divmod(abs(cents), 100)
    return f"{sign}{whole}.{rest:02d}"


def parse_count(text: str) -> int:
    """A whole number of at least zero, such as a number of minutes."""
    if not text.strip().isdigit():
        raise FareError(f"invalid whole number {text!r}")
    return int(text)


class FareRule(ABC):
    """Prices journeys. Subclasses are frozen dataclasses whose fields are listed, with
    the parser of their text form, in `parameters`; fields with defaults are optional."""

    name: ClassVar[str]
    parameters: ClassVar[dict[str, Callable[[str], int]]]

    def cost(self, journey: Journey) -> int:
        """The price of `journey` in cents."""
        rides = journey.rides
        if not rides:
            return 0
        return self.rides_cost(rides)

    @abstractmethod
    def rides_cost(self, rides: Sequence[RideLeg]) -> int:
        """The price of a journey made of `rides` (at least one), in cents."""

    def spec(self) -> str:
        """The rule as a fare spec; `parse_fare(rule.spec()) == rule`."""
        parts = [self.name]
        for key, parser in self.parameters.items():
            value = getattr(self, key)
            if value is not None:
                parts.append(f"{key}={format_price(value) if parser is parse_price else value}")
        return " ".join(parts)

    def _check_not_negative(self, **values: int | None) -> None:
        for key, value in values.items():
            if value is not None and value < 0:
                raise FareError(f"{self.name} fare: {key} must not be negative, got {value}")


@register_fare
@dataclass(frozen=True)
class FlatFare(FareRule):
    """One ticket at `price` covers the whole journey, changes included."""

    name: ClassVar[str] = "flat"
    parameters: ClassVar[dict[str, Callable[[str], int]]] = {"price": parse_price}

    price: int

    def __post_init__(self) -> None:
        self._check_not_negative(price=self.price)

    def rides_cost(self, rides: Sequence[RideLeg]) -> int:
        return self.price


@register_fare
@dataclass(frozen=True)
class ZoneFare(FareRule):
    """`base` for the first fare zone and `per_zone` for every other zone the rides
    pass through (every stop called at counts, not only where one gets on and off)."""

    name: ClassVar[str] = "zone"
    parameters: ClassVar[dict[str, Callable[[str], int]]] = {"base": parse_price, "per_zone": parse_price}

    base: int
    per_zone: int

    def __post_init__(self) -> None:
        self._check_not_negative(base=self.base, per_zone=self.per_zone)

    def rides_cost(self, rides: Sequence[RideLeg]) -> int:
        zones: set[str] = set()
        for ride in rides:
            for stop in ride.stops:
                if not stop.zone:
                    raise FareError(f"stop {stop.stop_id} has no fare zone")
                zones.add(stop.zone)
        return self.base + self.per_zone * (len(zones) - 1)


@register_fare
@dataclass(frozen=True)
class DistanceFare(FareRule):
    """`base` plus `per_km` for every started kilometre ridden (all rides together),
    at most `cap` when one is given."""

    name: ClassVar[str] = "distance"
    parameters: ClassVar[dict[str, Callable[[str], int]]] = {
        "base": parse_price,
        "per_km": parse_price,
        "cap": parse_price,
    }

    base: int
    per_km: int
    cap: int | None = None

    def __post_init__(self) -> None:
        self._check_not_negative(base=self.base, per_km=self.per_km, cap=self.cap)
        if self.cap is not None and self.cap < self.base:
            raise FareError(f"distance fare: cap {format_price(self.cap)} is below the base fare")

    def rides_cost(self, rides: Sequence[RideLeg]) -> int:
        kilometres = math.ceil(round(sum(ride.distance for ride in rides)) / 1000)
        price = self.base + self.per_km * kilometres
        return price if self.cap is None else min(price, self.cap)


def create_fare(name: str, **params: int | None) -> FareRule:
    """A rule of the registered kind `name` with the given parameters."""
    cls = get_fare_class(name)
    unknown = sorted(set(params) - set(cls.parameters))
    if unknown:
        raise FareError(f"{cls.name} fare: unknown parameter {unknown[0]!r}")
    missing = [f.name for f in fields(cls) if f.name not in params and f.default is MISSING]
    if missing:
        raise FareError(f"{cls.name} fare: missing parameter {missing[0]!r}")
    return cls(**params)


def parse_fare(spec: str) -> FareRule:
    """A rule from its spec: the rule name, then `key=value` parameters."""
    words = spec.split()
    if not words:
        raise FareError("empty fare spec")
    cls = get_fare_class(words[0])
    params: dict[str, int] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        if not sep or not key or not value:
            raise FareError(f"{cls.name} fare: expected key=value, got {word!r}")
        if key not in cls.parameters:
            raise FareError(f"{cls.name} fare: unknown parameter {key!r}")
        if key in params:
            raise FareError(f"{cls.name} fare: parameter {key!r} given twice")
        params[key] = cls.parameters[key](value)
    return create_fare(cls.name, **params)
