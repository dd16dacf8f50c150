from datetime import datetime, timedelta
from itertools import islice

import pytest

from scheduler.errors import RecurrenceError, ValidationError
from scheduler.events import Event, Occurrence
from scheduler.recurrence import Frequency, RecurrenceRule, frequency_names, get_frequency, register_frequency

MON = datetime(2024, 1, 8, 9, 0)  # a Monday


def take(rule: RecurrenceRule, start: datetime, n: int = 50) -> list[datetime]:
    return list(islice(rule.occurrences(start), n))


def test_registry():
    assert {"DAILY", "WEEKLY", "MONTHLY"} <= set(frequency_names())
    assert get_frequency("weekly").name == "WEEKLY"
    with pytest.raises(RecurrenceError, match="unknown frequency"):
        get_frequency("HOURLY")

    class Again(Frequency):
        name = "DAILY"

        def candidates(self, start, interval, byday):
            yield start

    with pytest.raises(ValueError):
        register_frequency(Again)


def test_rule_validation():
    assert RecurrenceRule("daily").freq == "DAILY"
    assert RecurrenceRule("WEEKLY", byday=(4, 0, 4)).byday == (0, 4)
    bad = [
        dict(freq="DAILY", interval=0),
        dict(freq="DAILY", count=0),
        dict(freq="DAILY", count=2, until=MON),
        dict(freq="DAILY", byday=(0,)),
        dict(freq="WEEKLY", byday=(7,)),
        dict(freq="WEEKLY", byday=(-1,)),
        dict(freq="HOURLY"),
    ]
    for kwargs in bad:
        with pytest.raises(RecurrenceError):
            RecurrenceRule(**kwargs)
    assert RecurrenceRule("DAILY", count=1).is_finite
    assert RecurrenceRule("DAILY", until=MON).is_finite
    assert not RecurrenceRule("DAILY").is_finite


def test_daily_with_count_and_interval():
    assert take(RecurrenceRule("DAILY", count=3), MON) == [MON, MON + timedelta(days=1), MON + timedelta(days=2)]
    assert take(RecurrenceRule("DAILY", interval=3, count=2), MON) == [MON, MON + timedelta(days=3)]
    assert take(RecurrenceRule("DAILY", count=1), MON) == [MON]
    assert len(take(RecurrenceRule("DAILY"), MON, 40)) == 40


def test_until_is_inclusive():
    rule = RecurrenceRule("DAILY", until=MON + timedelta(days=2))
    assert take(rule, MON)[-1] == MON + timedelta(days=2)
    assert len(take(rule, MON)) == 3
    rule = RecurrenceRule("DAILY", until=MON + timedelta(days=2, seconds=-1))
    assert len(take(rule, MON)) == 2


def test_weekly():
    rule = RecurrenceRule("WEEKLY", interval=2, count=3)
    assert take(rule, MON) == [MON, MON + timedelta(weeks=2), MON + timedelta(weeks=4)]


def test_weekly_byday():
    rule = RecurrenceRule("WEEKLY", count=5, byday=(0, 2, 4))  # MO, WE, FR
    assert [d.day for d in take(rule, MON)] == [8, 10, 12, 15, 17]
    wednesday = MON + timedelta(days=2)
    assert [d.day for d in take(rule, wednesday)] == [10, 12, 15, 17, 19]
    rule = RecurrenceRule("WEEKLY", interval=2, count=4, byday=(1, 3))  # TU, TH every other week
    assert [d.day for d in take(rule, MON)] == [9, 11, 23, 25]
    assert all(d.time() == MON.time() for d in take(rule, MON))


def test_monthly_skips_missing_days():
    start = datetime(2024, 1, 31, 18)
    assert [(d.month, d.day) for d in take(RecurrenceRule("MONTHLY", count=4), start)] == [
        (1, 31),
        (3, 31),
        (5, 31),
        (7, 31),
    ]
    rule = RecurrenceRule("MONTHLY", interval=2, count=3)
    assert [(d.year, d.month) for d in take(rule, datetime(2024, 11, 15))] == [(2024, 11), (2025, 1), (2025, 3)]
    rule = RecurrenceRule("MONTHLY", until=datetime(2024, 4, 15))
    assert [d.month for d in take(rule, datetime(2024, 1, 15))] == [1, 2, 3, 4]


def test_event_validation():
    with pytest.raises(ValidationError):
        Event("a b", "Title", MON, MON + timedelta(hours=1))
    with pytest.raises(ValidationError):
        Event("", "Title", MON, MON + timedelta(hours=1))
    with pytest.raises(ValidationError):
        Event("x", " ", MON, MON + timedelta(hours=1))
    with pytest.raises(ValidationError):
        Event("x", "Title", MON, MON)
    event = Event("x", "Title", MON, MON + timedelta(minutes=30), exdates={MON})
    assert event.exdates == frozenset({MON})
    assert event.duration == timedelta(minutes=30)
    assert not event.is_recurring


def test_single_event_occurrences_window_edges():
    event = Event("x", "Meeting", MON, MON + timedelta(hours=1))
    assert event.occurrences(MON - timedelta(hours=1), MON) == []
    assert event.occurrences(MON + timedelta(hours=1), MON + timedelta(hours=2)) == []
    (occ,) = event.occurrences(MON + timedelta(minutes=59), MON + timedelta(hours=2))
    assert occ == Occurrence(MON, MON + timedelta(hours=1), "x", "Meeting")
    later = Occurrence(MON + timedelta(minutes=59), MON + timedelta(hours=2), "y", "Other")
    assert occ.overlaps(later) is True and later.overlaps(occ) is True
    assert occ.overlaps(Occurrence(MON + timedelta(hours=1), MON + timedelta(hours=2), "z", "Next")) is False
    assert len(event.occurrences(MON - timedelta(hours=1), MON + timedelta(minutes=1))) == 1
    with pytest.raises(ValidationError):
        event.occurrences(MON, MON)


def test_recurring_event_occurrences_and_exdates():
    rule = RecurrenceRule("DAILY", count=5)
    event = Event("d", "Daily", MON, MON + timedelta(minutes=15), rule, exdates={MON + timedelta(days=1)})
    starts = [o.start.day for o in event.occurrences(MON, MON + timedelta(days=10))]
    assert starts == [8, 10, 11, 12]
    window = event.occurrences(MON + timedelta(days=2, minutes=10), MON + timedelta(days=3, minutes=1))
    assert [o.start.day for o in window] == [10, 11]
    assert event.is_recurring


def test_cancel_occurrence():
    event = Event("d", "Daily", MON, MON + timedelta(minutes=15), RecurrenceRule("DAILY"))
    event.cancel(MON + timedelta(days=2))
    assert [o.start.day for o in event.occurrences(MON, MON + timedelta(days=4))] == [8, 9, 11]
    with pytest.raises(ValidationError, match="no occurrence"):
        event.cancel(MON + timedelta(days=2))
    with pytest.raises(ValidationError):
        event.cancel(MON + timedelta(hours=1))
    assert event.occurrence_starts_until(MON + timedelta(days=1)) == [MON, MON + timedelta(days=1)]
