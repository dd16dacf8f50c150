"""Date and time helpers: intervals, month arithmetic, working hours and text formats.

All datetimes are naive (no time zone): a calendar lives in one local time.
"""

from __future__ import annotations

import calendar as _calendar
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta

from .errors import ValidationError

#: Text form of datetimes in calendar files ("20240105T093000").
DATETIME_FORMAT = "%Y%m%dT%H%M%S"
#: Two-letter weekday codes, Monday first (index = `date.weekday()`).
WEEKDAY_CODES = ("MO", "TU", "WE", "TH", "FR", "SA", "SU")
#: Default working hours and days for finding free time.
WORK_START = time(9, 0)
WORK_END = time(17, 0)
WORKDAYS = frozenset(range(5))


@dataclass(frozen=True, order=True)
class Interval:
    """The half-open time span [start, end); `end` is after `start`."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.end <= self.start:
            raise ValidationError(f"interval ends ({self.end}) before or when it starts ({self.start})")

    @property
    def duration(self) -> timedelta:
        return self.end - self.start

    def overlaps(self, other: Interval) -> bool:
        """True if the spans share some time (touching ends do not overlap)."""
        return self.start < other.end and other.start < self.end

    def contains(self, moment: datetime) -> bool:
        return self.start <= moment < self.end

    def intersection(self, other: Interval) -> Interval | None:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return Interval(start, end) if start < end else None


def merge_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, non-overlapping intervals covering the same time; touching ones are joined."""
    merged: list[Interval] = []
    for interval in sorted(intervals):
        if merged and interval.start <= merged[-1].end:
            if interval.end > merged[-1].end:
                merged[-1] = Interval(merged[-1].start, interval.end)
        else:
            merged.append(interval)
    return merged


def subtract(window: Interval, busy: Iterable[Interval]) -> list[Interval]:
    """The parts of `window` not covered by any of `busy`, in order."""
    gaps: list[Interval] = []
    cursor = window.start
    for block in merge_intervals(busy):
        if block.end <= cursor:
            continue
        if block.start >= window.end:
            break
        if block.start > cursor:
            gaps.append(Interval(cursor, block.start))
        cursor = max(cursor, block.end)
    if cursor < window.end:
        gaps.append(Interval(cursor, window.end))
    return gaps


def days_in_month(year: int, month: int) -> int:
    return _calendar.monthrange(year, month)[1]


def add_months(moment: datetime, months: int) -> datetime | None:
    """`moment` moved by `months` calendar months, or None if that day does not exist
    (January 31 + 1 month); the time of day is kept."""
    index = moment.year * 12 + (moment.month - 1) + months
    year, month = divmod(index, 12)
    if moment.day > days_in_month(year, month + 1):
        return None
    return moment.replace(year=year, month=month + 1)


def days(first: date, last: date) -> Iterator[date]:
    """Every date from `first` to `last`, both included."""
    if last < first:
        raise ValidationError(f"empty date range: {first} to {last}")
    for offset in range((last - first).days + 1):
        yield first + timedelta(days=offset)


def working_window(day: date, start: time = WORK_START, end: time = WORK_END) -> Interval:
    """The working hours of `day` as an interval."""
    return Interval(datetime.combine(day, start), datetime.combine(day, end))


def parse_datetime(text: str) -> datetime:
    """Parses "20240105T093000" (seconds required)."""
    try:
        return datetime.strptime(text.strip(), DATETIME_FORMAT)
    except ValueError:
        raise ValidationError(f"not a datetime (YYYYMMDDTHHMMSS): {text!r}") from None


def format_datetime(moment: datetime) -> str:
    return moment.strftime(DATETIME_FORMAT)


def parse_weekday(code: str) -> int:
    """ "MO" -> 0 ... "SU" -> 6."""
    try:
        return WEEKDAY_CODES.index(code.strip().upper())
    except ValueError:
        raise ValidationError(f"not a weekday code: {code!r}") from None
