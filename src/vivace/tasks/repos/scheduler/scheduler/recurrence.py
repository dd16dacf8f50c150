"""Recurrence rules: when a repeating event happens.

A `Frequency` produces the candidate start times of a series (every `interval` days,
weeks or months from the first start); `RecurrenceRule` limits them with `count` or
`until`. Frequencies are registered by name with `@register_frequency`, the names being
those of the RRULE `FREQ` part (DAILY, WEEKLY, MONTHLY).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import count as _count
from typing import ClassVar

from .errors import RecurrenceError
from .timeutil import WEEKDAY_CODES, add_months

_FREQUENCIES: dict[str, Frequency] = {}


def register_frequency(cls: type[Frequency]) -> type[Frequency]:
    """Class decorator: makes the frequency available under `cls.name`."""
    if cls.name in _FREQUENCIES:
        raise ValueError(f"frequency {cls.name} is already registered")
    _FREQUENCIES[cls.name] = cls()
    return cls


def get_frequency(name: str) -> Frequency:
    try:
        return _FREQUENCIES[name.upper()]
    except KeyError:
        raise RecurrenceError(f"unknown frequency {name!r} (known: {', '.join(frequency_names())})") from None


def frequency_names() -> list[str]:
    return sorted(_FREQUENCIES)


class Frequency(ABC):
    """How a series advances; `candidates` yields start times in increasing order."""

    name: ClassVar[str]
    #: Whether the rule may restrict occurrences to some weekdays (BYDAY).
    supports_byday: ClassVar[bool] = False

    @abstractmethod
    def candidates(self, start: datetime, interval: int, byday: tuple[int, ...]) -> Iterator[datetime]:
        """Every start time of the unbounded series, beginning at or after `start`."""


@register_frequency
class Daily(Frequency):
    name = "DAILY"

    def candidates(self, start: datetime, interval: int, byday: tuple[int, ...]) -> Iterator[datetime]:
        for n in _count():
            yield start + timedelta(days=n * interval)


@register_frequency
class Weekly(Frequency):
    """Every `interval` weeks; with `byday`, on those weekdays of each such week
    (weeks start on Monday)."""

    name = "WEEKLY"
    supports_byday = True

    def candidates(self, start: datetime, interval: int, byday: tuple[int, ...]) -> Iterator[datetime]:
        if not byday:
            for n in _count():
                yield start + timedelta(weeks=n * interval)
            return
        week = start - timedelta(days=start.weekday())
        for n in _count():
            monday = week + timedelta(weeks=n * interval)
            for weekday in byday:
                moment = monday + timedelta(days=weekday)
                if moment >= start:
                    yield moment


@register_frequency
class Monthly(Frequency):
    """Every `interval` months on the start's day of the month; months without that day
    (the 31st in April) are skipped, as in RFC 5545."""

    name = "MONTHLY"

    def candidates(self, start: datetime, interval: int, byday: tuple[int, ...]) -> Iterator[datetime]:
        for n in _count():
            moment = add_months(start, n * interval)
            if moment is not None:
                yield moment


@dataclass(frozen=True)
class RecurrenceRule:
    """A repetition: `freq` every `interval` units, at most `count` times or up to
    `until` (included), optionally only on the weekdays `byday` (0 = Monday)."""

    freq: str
    interval: int = 1
    count: int | None = None
    until: datetime | None = None
    byday: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        frequency = get_frequency(self.freq)
        object.__setattr__(self, "freq", frequency.name)
        if self.interval < 1:
            raise RecurrenceError(f"interval must be at least 1, got {self.interval}")
        if self.count is not None and self.count < 1:
            raise RecurrenceError(f"count must be at least 1, got {self.count}")
        if self.count is not None and self.until is not None:
            raise RecurrenceError("give count or until, not both")
        if self.byday and not frequency.supports_byday:
            raise RecurrenceError(f"BYDAY is not supported with {frequency.name}")
        if any(not 0 <= d < len(WEEKDAY_CODES) for d in self.byday):
            raise RecurrenceError(f"weekdays are 0 (Monday) to 6 (Sunday), got {self.byday}")
        object.__setattr__(self, "byday", tuple(sorted(set(self.byday))))

    @property
    def is_finite(self) -> bool:
        return self.count is not None or self.until is not None

    def occurrences(self, start: datetime) -> Iterator[datetime]:
        """Start times of the series whose first start is `start`, in order."""
        frequency = get_frequency(self.freq)
        for n, moment in enumerate(frequency.candidates(start, self.interval, self.byday)):
            if self.count is not None and n >= self.count:
                return
            if self.until is not None and moment > self.until:
                return
            yield moment
