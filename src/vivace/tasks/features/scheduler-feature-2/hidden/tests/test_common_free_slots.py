from datetime import date, datetime, time, timedelta

import pytest

import scheduler
from scheduler import planner
from scheduler.errors import ValidationError
from scheduler.events import Event
from scheduler.planner import Calendar
from scheduler.recurrence import RecurrenceRule
from scheduler.timeutil import Interval

MON, TUE = date(2024, 1, 8), date(2024, 1, 9)


def at(hour: int, minute: int = 0, day: int = 8) -> datetime:
    return datetime(2024, 1, day, hour, minute)


@pytest.fixture
def alice() -> Calendar:
    cal = Calendar("alice")
    cal.add(Event("standup", "Stand-up", at(9), at(9, 30), RecurrenceRule("DAILY", count=5)))
    cal.add(Event("review", "Review", at(14), at(15)))
    return cal


@pytest.fixture
def bob() -> Calendar:
    cal = Calendar("bob")
    cal.add(Event("dentist", "Dentist", at(11), at(12, 30)))
    cal.add(Event("lunch", "Lunch", at(12), at(13), RecurrenceRule("WEEKLY", byday=(0, 1))))
    cal.add(Event("late", "Late call", at(16, 30), at(18)))
    return cal


def test_slots_free_for_everyone(alice, bob):
    assert planner.common_free_slots([alice, bob], MON, MON, timedelta(minutes=30)) == [
        Interval(at(9, 30), at(11)),
        Interval(at(13), at(14)),
        Interval(at(15), at(16, 30)),
    ]


def test_minimum_duration_is_inclusive(alice, bob):
    assert planner.common_free_slots([alice, bob], MON, MON, timedelta(minutes=90)) == [
        Interval(at(9, 30), at(11)),
        Interval(at(15), at(16, 30)),
    ]
    assert planner.common_free_slots([alice, bob], MON, MON, timedelta(minutes=91)) == []


def test_several_days_and_weekends(alice, bob):
    slots = planner.common_free_slots([alice, bob], MON, date(2024, 1, 14), timedelta(hours=3))
    assert slots == [
        Interval(at(13, day=9), at(17, day=9)),
        Interval(at(9, 30, day=10), at(17, day=10)),
        Interval(at(9, 30, day=11), at(17, day=11)),
        Interval(at(9, 30, day=12), at(17, day=12)),
    ]


def test_same_as_free_slots_for_one_calendar(alice, bob):
    for cal in (alice, bob):
        assert planner.common_free_slots([cal], MON, TUE, timedelta(minutes=15)) == cal.free_slots(
            MON, TUE, timedelta(minutes=15)
        )
    empty = Calendar()
    assert planner.common_free_slots([alice, empty], MON, MON, timedelta(hours=1)) == alice.free_slots(
        MON, MON, timedelta(hours=1)
    )


def test_custom_working_hours_and_days(alice, bob):
    slots = planner.common_free_slots(
        [alice, bob], date(2024, 1, 13), date(2024, 1, 15), timedelta(hours=1),
        work_start=time(8), work_end=time(13), workdays=frozenset({5, 0}),
    )  # fmt: skip
    assert slots == [
        Interval(at(8, day=13), at(13, day=13)),
        Interval(at(8, day=15), at(12, day=15)),
    ]


def test_exported_from_the_package():
    assert scheduler.common_free_slots is planner.common_free_slots


def test_invalid_arguments(alice):
    with pytest.raises(ValidationError):
        planner.common_free_slots([], MON, MON, timedelta(hours=1))
    with pytest.raises(ValidationError):
        planner.common_free_slots([alice], MON, MON, timedelta(0))
    with pytest.raises(ValidationError):
        planner.common_free_slots([alice], TUE, MON, timedelta(hours=1))
