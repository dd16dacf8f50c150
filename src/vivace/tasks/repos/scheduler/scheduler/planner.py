"""`Calendar`: a set of events, with conflict detection and free-time search."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date, datetime, time, timedelta

from .errors import ConflictError, SchedulerError, ValidationError
from .events import Event, Occurrence
from .timeutil import WORK_END, WORK_START, WORKDAYS, Interval, days, merge_intervals, subtract, working_window

#: How far ahead conflicts of an endlessly repeating event are looked for.
CONFLICT_HORIZON = timedelta(days=366)


class Calendar:
    """Events by uid, in the order they were added."""

    def __init__(self, name: str = "") -> None:
        self.name = name
        self._events: dict[str, Event] = {}

    def __len__(self) -> int:
        return len(self._events)

    def __iter__(self) -> Iterator[Event]:
        return iter(self._events.values())

    def __contains__(self, uid: object) -> bool:
        return uid in self._events

    def get(self, uid: str) -> Event:
        try:
            return self._events[uid]
        except KeyError:
            raise SchedulerError(f"no event {uid!r}") from None

    def add(self, event: Event, check_conflicts: bool = False) -> Event:
        """Adds `event`; with `check_conflicts`, refuses it if it overlaps another event."""
        if event.uid in self._events:
            raise SchedulerError(f"an event with uid {event.uid!r} already exists")
        if check_conflicts:
            clashes = self.conflicts_with(event)
            if clashes:
                first = clashes[0]
                raise ConflictError(f"{event.uid} overlaps {first.uid} at {first.start}")
        self._events[event.uid] = event
        return event

    def remove(self, uid: str) -> Event:
        event = self.get(uid)
        del self._events[uid]
        return event

    # -- queries ------------------------------------------------------------------------

    def occurrences(self, start: datetime, end: datetime) -> list[Occurrence]:
        """Occurrences of all events overlapping [start, end), by start, end and uid."""
        found = [occ for event in self._events.values() for occ in event.occurrences(start, end)]
        return sorted(found)

    def on_day(self, day: date) -> list[Occurrence]:
        start = datetime.combine(day, time())
        return self.occurrences(start, start + timedelta(days=1))

    def conflicts(self, start: datetime, end: datetime) -> list[tuple[Occurrence, Occurrence]]:
        """Pairs of overlapping occurrences within [start, end), earlier-starting first."""
        occurrences = self.occurrences(start, end)
        pairs = []
        for i, first in enumerate(occurrences):
            for second in occurrences[i + 1 :]:
                if second.start >= first.end:
                    break
                pairs.append((first, second))
        return pairs

    def conflicts_with(self, event: Event) -> list[Occurrence]:
        """Existing occurrences that overlap an occurrence of `event` (which is not in the
        calendar), looking `CONFLICT_HORIZON` ahead of its start, in order."""
        mine = event.occurrences(event.start, event.start + CONFLICT_HORIZON)
        if not mine:
            return []
        theirs = self.occurrences(mine[0].start, mine[-1].end)
        clashes = []
        i = 0
        for other in theirs:  # both lists are sorted by start (and `mine` also by end)
            while i < len(mine) and mine[i].end <= other.start:
                i += 1
            if i < len(mine) and mine[i].start < other.end:
                clashes.append(other)
        return clashes

    def busy(self, start: datetime, end: datetime) -> list[Interval]:
        """Merged busy time within [start, end)."""
        window = Interval(start, end)
        blocks = [occ.interval.intersection(window) for occ in self.occurrences(start, end)]
        return merge_intervals(b for b in blocks if b is not None)

    def free_slots(
        self,
        first_day: date,
        last_day: date,
        duration: timedelta,
        work_start: time = WORK_START,
        work_end: time = WORK_END,
        workdays: frozenset[int] = WORKDAYS,
    ) -> list[Interval]:
        """Free stretches of at least `duration` within working hours on working days
        from `first_day` to `last_day` (both included), in order."""
        if duration <= timedelta(0):
            raise ValidationError("duration must be positive")
        slots: list[Interval] = []
        for day in days(first_day, last_day):
            if day.weekday() not in workdays:
                continue
            window = working_window(day, work_start, work_end)
            for gap in subtract(window, self.busy(window.start, window.end)):
                if gap.duration >= duration:
                    slots.append(gap)
        return slots

    def next_free_slot(self, after: datetime, duration: timedelta, horizon_days: int = 14, **hours) -> Interval | None:
        """The earliest free slot of exactly `duration` starting at or after `after`,
        looking `horizon_days` days ahead; None if there is none."""
        last_day = after.date() + timedelta(days=horizon_days)
        for gap in self.free_slots(after.date(), last_day, duration, **hours):
            start = max(gap.start, after)
            if gap.end - start >= duration:
                return Interval(start, start + duration)
        return None
