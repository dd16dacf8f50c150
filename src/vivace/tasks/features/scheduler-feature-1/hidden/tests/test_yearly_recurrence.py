from datetime import datetime, timedelta
from itertools import islice

import pytest

from scheduler.errors import RecurrenceError
from scheduler.events import Event
from scheduler.ics import dumps, loads, parse_rrule
from scheduler.planner import Calendar
from scheduler.recurrence import RecurrenceRule, frequency_names


def take(rule, start, n=20):
    return list(islice(rule.occurrences(start), n))


def test_yearly_is_a_known_frequency():
    assert "YEARLY" in frequency_names()
    assert RecurrenceRule("yearly").freq == "YEARLY"
    with pytest.raises(RecurrenceError):
        RecurrenceRule("YEARLY", byday=(0,))


def test_yearly_with_count_and_interval():
    start = datetime(2024, 3, 15, 18, 30)
    assert take(RecurrenceRule("YEARLY", count=3), start) == [
        datetime(2024, 3, 15, 18, 30),
        datetime(2025, 3, 15, 18, 30),
        datetime(2026, 3, 15, 18, 30),
    ]
    assert [d.year for d in take(RecurrenceRule("YEARLY", interval=2, count=3), start)] == [2024, 2026, 2028]
    assert take(RecurrenceRule("YEARLY", count=1), start) == [start]


def test_yearly_until_is_inclusive():
    start = datetime(2024, 12, 31, 9)
    rule = RecurrenceRule("YEARLY", until=datetime(2027, 12, 31, 9))
    assert [d.year for d in take(rule, start)] == [2024, 2025, 2026, 2027]
    rule = RecurrenceRule("YEARLY", until=datetime(2027, 12, 31, 8, 59))
    assert [d.year for d in take(rule, start)] == [2024, 2025, 2026]


def test_february_29_only_in_leap_years():
    start = datetime(2024, 2, 29, 12)
    assert [d.year for d in take(RecurrenceRule("YEARLY", count=3), start)] == [2024, 2028, 2032]
    assert all((d.month, d.day) == (2, 29) for d in take(RecurrenceRule("YEARLY", count=3), start))
    assert [d.year for d in take(RecurrenceRule("YEARLY", until=datetime(2030, 1, 1)), start)] == [2024, 2028]


def test_yearly_events_in_a_calendar():
    cal = Calendar()
    birthday = Event("bday", "Birthday", datetime(2020, 6, 1, 19), datetime(2020, 6, 1, 22), RecurrenceRule("YEARLY"))
    cal.add(birthday)
    found = cal.occurrences(datetime(2024, 1, 1), datetime(2026, 1, 1))
    assert [o.start for o in found] == [datetime(2024, 6, 1, 19), datetime(2025, 6, 1, 19)]
    assert found[0].end - found[0].start == timedelta(hours=3)


def test_yearly_rules_in_calendar_text():
    rule = parse_rrule("FREQ=YEARLY;INTERVAL=2;COUNT=3")
    assert rule == RecurrenceRule("YEARLY", interval=2, count=3)
    cal = Calendar()
    cal.add(Event("y", "Audit", datetime(2024, 1, 10, 9), datetime(2024, 1, 10, 17), RecurrenceRule("YEARLY", count=5)))
    text = dumps(cal)
    assert "RRULE:FREQ=YEARLY;COUNT=5" in text
    assert loads(text).get("y").rule == RecurrenceRule("YEARLY", count=5)
