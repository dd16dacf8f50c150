from datetime import date, datetime, time, timedelta

import pytest

from scheduler.errors import ConflictError, SchedulerError, ValidationError
from scheduler.events import Event
from scheduler.planner import Calendar
from scheduler.recurrence import RecurrenceRule
from scheduler.timeutil import Interval

MON = date(2024, 1, 8)


def at(hour: int, minute: int = 0, day: int = 8) -> datetime:
    return datetime(2024, 1, day, hour, minute)


def event(uid: str, start: datetime, end: datetime, rule: RecurrenceRule | None = None) -> Event:
    return Event(uid, uid.title(), start, end, rule)


@pytest.fixture
def cal() -> Calendar:
    c = Calendar("Work")
    c.add(event("standup", at(9), at(9, 15), RecurrenceRule("DAILY", count=5)))
    c.add(event("review", at(14), at(15)))
    c.add(event("lunch", at(12), at(13), RecurrenceRule("WEEKLY", byday=(0, 2))))
    return c


def test_add_get_remove(cal):
    assert len(cal) == 3
    assert "review" in cal and "nope" not in cal
    assert [e.uid for e in cal] == ["standup", "review", "lunch"]
    assert cal.get("review").title == "Review"
    with pytest.raises(SchedulerError, match="already exists"):
        cal.add(event("review", at(16), at(17)))
    assert cal.remove("review").uid == "review"
    assert len(cal) == 2
    with pytest.raises(SchedulerError, match="no event"):
        cal.get("review")


def test_occurrences_are_sorted(cal):
    found = cal.occurrences(at(0), at(0, day=11))
    assert [(o.uid, o.start.day, o.start.hour) for o in found] == [
        ("standup", 8, 9),
        ("lunch", 8, 12),
        ("review", 8, 14),
        ("standup", 9, 9),
        ("standup", 10, 9),
        ("lunch", 10, 12),
    ]


def test_on_day(cal):
    assert [o.uid for o in cal.on_day(date(2024, 1, 10))] == ["standup", "lunch"]
    assert [o.uid for o in cal.on_day(date(2024, 1, 13))] == []
    assert [o.uid for o in cal.on_day(date(2024, 1, 15))] == ["lunch"]


def test_conflicts(cal):
    assert cal.conflicts(at(0), at(0, day=9)) == []
    cal.add(event("call", at(14, 30), at(16)))
    cal.add(event("sync", at(15), at(15, 30)))
    cal.add(event("late", at(16), at(17)))
    pairs = [(a.uid, b.uid) for a, b in cal.conflicts(at(0), at(0, day=9))]
    assert pairs == [("review", "call"), ("call", "sync")]


def test_conflicts_with_recurring_events(cal):
    cal.add(event("gym", at(12, 30), at(13, 30, day=10)))
    pairs = [(a.uid, b.uid, b.start.day) for a, b in cal.conflicts(at(0), at(0, day=11))]
    assert pairs == [
        ("lunch", "gym", 8),
        ("gym", "review", 8),
        ("gym", "standup", 9),
        ("gym", "standup", 10),
        ("gym", "lunch", 10),
    ]
    assert cal.conflicts(at(0, day=11), at(0, day=12)) == []


def test_conflicts_with_new_event(cal):
    assert cal.conflicts_with(event("free", at(13), at(14))) == []
    clashes = cal.conflicts_with(event("long", at(11), at(14, 1)))
    assert [(o.uid, o.start.hour) for o in clashes] == [("lunch", 12), ("review", 14)]
    weekly = event("wed", at(12, 59, day=3), at(13, day=3), RecurrenceRule("WEEKLY"))
    clashes = cal.conflicts_with(weekly)  # Wednesdays from Jan 10, 2024 to Jan 1, 2025
    assert (clashes[0].start, clashes[-1].start, len(clashes)) == (at(12, day=10), datetime(2025, 1, 1, 12), 52)
    short = event("wed2", at(12, 59, day=3), at(13, day=3), RecurrenceRule("WEEKLY", count=2))
    assert [o.start for o in cal.conflicts_with(short)] == [at(12, day=10)]
    touching = event("after", at(13, day=15), at(14, day=15), RecurrenceRule("DAILY", count=3))
    assert cal.conflicts_with(touching) == []
    before = event("before", at(11, day=15), at(12, day=15), RecurrenceRule("DAILY", count=3))
    assert cal.conflicts_with(before) == []
    assert [o.start for o in cal.conflicts_with(event("over", at(11, day=15), at(12, 1, day=15)))] == [at(12, day=15)]


def test_add_with_conflict_check(cal):
    with pytest.raises(ConflictError, match="early overlaps standup at 2024-01-08 09:00:00"):
        cal.add(event("early", at(8, 30), at(9, 1, day=8)), check_conflicts=True)
    assert "early" not in cal
    cal.add(event("early", at(8, 30), at(9)), check_conflicts=True)
    cal.add(event("clash", at(9), at(10)))  # not checked by default
    assert len(cal) == 5


def test_busy_merges_and_clips(cal):
    cal.add(event("prep", at(11, 30), at(12, 30)))
    assert cal.busy(at(9, 10), at(13)) == [Interval(at(9, 10), at(9, 15)), Interval(at(11, 30), at(13))]
    assert cal.busy(at(15), at(16)) == []


def test_free_slots(cal):
    slots = cal.free_slots(MON, MON, timedelta(minutes=30))
    assert slots == [
        Interval(at(9, 15), at(12)),
        Interval(at(13), at(14)),
        Interval(at(15), at(17)),
    ]
    assert cal.free_slots(MON, MON, timedelta(hours=2)) == [Interval(at(9, 15), at(12)), Interval(at(15), at(17))]
    assert cal.free_slots(MON, MON, timedelta(hours=2, minutes=1)) == [Interval(at(9, 15), at(12))]
    assert cal.free_slots(MON, MON, timedelta(hours=2, minutes=45)) == [Interval(at(9, 15), at(12))]
    assert cal.free_slots(MON, MON, timedelta(hours=2, minutes=46)) == []


def test_free_slots_skip_weekends_and_use_custom_hours(cal):
    saturday, sunday = date(2024, 1, 13), date(2024, 1, 14)
    assert cal.free_slots(saturday, sunday, timedelta(hours=1)) == []
    slots = cal.free_slots(
        saturday, saturday, timedelta(hours=1), work_start=time(10), work_end=time(12), workdays=frozenset({5})
    )
    assert slots == [Interval(at(10, day=13), at(12, day=13))]
    slots = cal.free_slots(MON, date(2024, 1, 9), timedelta(hours=1), work_start=time(8), work_end=time(10))
    assert slots == [Interval(at(8), at(9)), Interval(at(8, day=9), at(9, day=9))]
    with pytest.raises(ValidationError):
        cal.free_slots(MON, MON, timedelta(0))


def test_next_free_slot(cal):
    assert cal.next_free_slot(at(9), timedelta(minutes=30)) == Interval(at(9, 15), at(9, 45))
    assert cal.next_free_slot(at(11, 45), timedelta(minutes=30)) == Interval(at(13), at(13, 30))
    assert cal.next_free_slot(at(11, 30), timedelta(minutes=30)) == Interval(at(11, 30), at(12))
    assert cal.next_free_slot(at(16, 30), timedelta(hours=1)) == Interval(at(9, 15, day=9), at(10, 15, day=9))
    assert cal.next_free_slot(at(9), timedelta(hours=9)) is None
    assert cal.next_free_slot(at(17, 0, day=12), timedelta(hours=1), horizon_days=1) is None
    assert cal.next_free_slot(at(17, 0, day=12), timedelta(hours=1), horizon_days=3) == Interval(
        at(9, day=15), at(10, day=15)
    )
    assert cal.next_free_slot(at(12, day=15), timedelta(hours=1), work_start=time(12), work_end=time(14)) == Interval(
        at(13, day=15), at(14, day=15)
    )


def test_occurrence_order_breaks_ties_by_end_then_uid():
    cal = Calendar()
    cal.add(event("b", at(10), at(11)))
    cal.add(event("a", at(10), at(11)))
    cal.add(event("c", at(10), at(10, 30)))
    assert [o.uid for o in cal.occurrences(at(0), at(23))] == ["c", "a", "b"]
    assert [(x.uid, y.uid) for x, y in cal.conflicts(at(0), at(23))] == [("c", "a"), ("c", "b"), ("a", "b")]


def test_busy_and_free_time_of_an_empty_calendar():
    cal = Calendar()
    assert cal.busy(at(9), at(17)) == []
    assert cal.free_slots(MON, MON, timedelta(hours=8)) == [Interval(at(9), at(17))]
    assert cal.free_slots(MON, MON, timedelta(hours=8, seconds=1)) == []
    assert cal.next_free_slot(at(8), timedelta(hours=1)) == Interval(at(9), at(10))
