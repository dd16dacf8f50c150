"""Events and their occurrences."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from .errors import ValidationError
from .recurrence import RecurrenceRule
from .timeutil import Interval


@dataclass(frozen=True, order=True)
class Occurrence:
    """One concrete instance of an event (a recurring event has many)."""

    start: datetime
    end: datetime
    uid: str
    title: str

    @property
    def interval(self) -> Interval:
        return Interval(self.start, self.end)

    def overlaps(self, other: Occurrence) -> bool:
        return self.interval.overlaps(other.interval)


@dataclass
class Event:
    """Something on the calendar from `start` to `end`, possibly repeating by `rule`.

    `exdates` are start times of occurrences that were cancelled.
    """

    uid: str
    title: str
    start: datetime
    end: datetime
    rule: RecurrenceRule | None = None
    location: str = ""
    exdates: frozenset[datetime] = field(default_factory=frozenset)

    def __post_init__(self) -> None:
        if not self.uid or any(c.isspace() for c in self.uid):
            raise ValidationError(f"an event uid must be non-empty without spaces, got {self.uid!r}")
        if not self.title.strip():
            raise ValidationError(f"event {self.uid} needs a title")
        if self.end <= self.start:
            raise ValidationError(f"event {self.uid} ends before it starts")
        self.exdates = frozenset(self.exdates)

    @property
    def duration(self) -> timedelta:
        return self.end - self.start

    @property
    def is_recurring(self) -> bool:
        return self.rule is not None

    def starts(self) -> Iterator[datetime]:
        """Start times of all occurrences, in order (cancelled ones left out)."""
        moments: Iterable[datetime] = [self.start] if self.rule is None else self.rule.occurrences(self.start)
        for moment in moments:
            if moment not in self.exdates:
                yield moment

    def occurrences(self, window_start: datetime, window_end: datetime) -> list[Occurrence]:
        """The occurrences that overlap [window_start, window_end), in order."""
        if window_end <= window_start:
            raise ValidationError("the window must end after it starts")
        found: list[Occurrence] = []
        for moment in self.starts():
            if moment >= window_end:
                break
            end = moment + self.duration
            if end > window_start:
                found.append(Occurrence(moment, end, self.uid, self.title))
        return found

    def cancel(self, moment: datetime) -> None:
        """Cancels the occurrence starting at `moment`."""
        if moment not in self.occurrence_starts_until(moment):
            raise ValidationError(f"event {self.uid} has no occurrence at {moment}")
        self.exdates = self.exdates | {moment}

    def occurrence_starts_until(self, last: datetime) -> list[datetime]:
        """Start times up to and including `last`."""
        result = []
        for moment in self.starts():
            if moment > last:
                break
            result.append(moment)
        return result
