from datetime import date, datetime, time, timedelta

import pytest

from scheduler.errors import ValidationError
from scheduler.timeutil import (
    Interval,
    add_months,
    days,
    days_in_month,
    format_datetime,
    merge_intervals,
    parse_datetime,
    parse_weekday,
    subtract,
    working_window,
)


def at(hour: int, minute: int = 0, day: int = 8) -> datetime:
    return datetime(2024, 1, day, hour, minute)


def iv(a: int, b: int) -> Interval:
    return Interval(at(a), at(b))


def test_interval_basics():
    interval = Interval(at(9), at(10, 30))
    assert interval.duration == timedelta(minutes=90)
    assert interval.contains(at(9)) and interval.contains(at(10, 29))
    assert not interval.contains(at(10, 30)) and not interval.contains(at(8, 59))
    with pytest.raises(ValidationError):
        Interval(at(10), at(10))
    with pytest.raises(ValidationError):
        Interval(at(10), at(9))


def test_interval_overlaps_is_strict_at_the_ends():
    assert iv(9, 11).overlaps(iv(10, 12))
    assert iv(10, 12).overlaps(iv(9, 11))
    assert iv(9, 12).overlaps(iv(10, 11))
    assert not iv(9, 10).overlaps(iv(10, 11))
    assert not iv(10, 11).overlaps(iv(9, 10))


def test_interval_intersection():
    assert iv(9, 11).intersection(iv(10, 12)) == iv(10, 11)
    assert iv(9, 12).intersection(iv(10, 11)) == iv(10, 11)
    assert iv(9, 10).intersection(iv(10, 11)) is None
    assert iv(9, 10).intersection(iv(11, 12)) is None


def test_merge_intervals():
    assert merge_intervals([]) == []
    assert merge_intervals([iv(13, 14), iv(9, 10), iv(9, 11)]) == [iv(9, 11), iv(13, 14)]
    assert merge_intervals([iv(9, 10), iv(10, 11)]) == [iv(9, 11)]
    assert merge_intervals([iv(9, 17), iv(10, 11), iv(12, 13)]) == [iv(9, 17)]
    assert merge_intervals([iv(9, 10), iv(11, 12)]) == [iv(9, 10), iv(11, 12)]


def test_subtract():
    window = iv(9, 17)
    assert subtract(window, []) == [window]
    assert subtract(window, [iv(10, 11), iv(13, 14)]) == [iv(9, 10), iv(11, 13), iv(14, 17)]
    assert subtract(window, [iv(8, 10), iv(16, 18)]) == [iv(10, 16)]
    assert subtract(window, [iv(7, 8), iv(17, 18)]) == [window]
    assert subtract(window, [iv(9, 17)]) == []
    assert subtract(window, [iv(9, 12), iv(11, 13)]) == [iv(13, 17)]
    assert subtract(window, [iv(12, 13), iv(10, 11)]) == [iv(9, 10), iv(11, 12), iv(13, 17)]


def test_days_in_month_and_add_months():
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 12) == 31
    assert add_months(datetime(2024, 1, 31, 9), 1) is None
    assert add_months(datetime(2024, 1, 31, 9), 2) == datetime(2024, 3, 31, 9)
    assert add_months(datetime(2024, 1, 29), 1) == datetime(2024, 2, 29)
    assert add_months(datetime(2024, 11, 15), 2) == datetime(2025, 1, 15)
    assert add_months(datetime(2024, 12, 15), 1) == datetime(2025, 1, 15)
    assert add_months(datetime(2024, 1, 15), 12) == datetime(2025, 1, 15)
    assert add_months(datetime(2024, 3, 15), -3) == datetime(2023, 12, 15)
    assert add_months(datetime(2024, 5, 15), 0) == datetime(2024, 5, 15)


def test_days_is_inclusive():
    assert list(days(date(2024, 1, 30), date(2024, 2, 1))) == [date(2024, 1, 30), date(2024, 1, 31), date(2024, 2, 1)]
    assert list(days(date(2024, 1, 1), date(2024, 1, 1))) == [date(2024, 1, 1)]
    with pytest.raises(ValidationError, match="empty date range: 2024-01-02 to 2024-01-01"):
        list(days(date(2024, 1, 2), date(2024, 1, 1)))


def test_working_window():
    assert working_window(date(2024, 1, 8)) == Interval(at(9), at(17))
    assert working_window(date(2024, 1, 8), time(8), time(12)) == Interval(at(8), at(12))


def test_datetime_text_format():
    assert parse_datetime("20240108T093005") == datetime(2024, 1, 8, 9, 30, 5)
    assert format_datetime(datetime(2024, 1, 8, 9, 30)) == "20240108T093000"
    for bad in ("2024-01-08T09:30:00", "20240108", "20241308T000000", ""):
        with pytest.raises(ValidationError):
            parse_datetime(bad)


def test_parse_weekday():
    assert parse_weekday("MO") == 0
    assert parse_weekday("su") == 6
    assert parse_weekday(" FR ") == 4
    with pytest.raises(ValidationError):
        parse_weekday("XX")
