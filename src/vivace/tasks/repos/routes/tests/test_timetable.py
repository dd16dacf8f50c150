from datetime import date

import pytest

from routes.errors import TimeFormatError, UnknownStopError, ValidationError
from routes.stops import Stop
from routes.timetable import (
    SECONDS_PER_DAY,
    ActiveTrip,
    Route,
    Service,
    StopTime,
    Timetable,
    Trip,
    as_seconds,
    format_time,
    make_trip,
    parse_time,
)

TUESDAY = date(2024, 3, 5)
SATURDAY = date(2024, 3, 9)


def test_parse_time():
    assert parse_time("00:00") == 0
    assert parse_time("08:05") == 8 * 3600 + 5 * 60
    assert parse_time("8:05") == 29100
    assert parse_time("23:59:59") == 86399
    assert parse_time("25:10") == SECONDS_PER_DAY + 70 * 60
    assert parse_time(" 47:59:59 ") == 47 * 3600 + 59 * 60 + 59
    assert parse_time("12:00:01") == 43201


def test_parse_time_rejects():
    for text in ("", "8", "08:5", "08:60", "48:00", "08:00:60", "ab:cd", "08:00:00:00", "-1:00", "123:00", "08:0a"):
        with pytest.raises(TimeFormatError, match="time"):
            parse_time(text)


def test_format_time():
    assert format_time(0) == "00:00"
    assert format_time(29100) == "08:05"
    assert format_time(29367) == "08:09:27"
    assert format_time(SECONDS_PER_DAY + 600) == "24:10"
    assert format_time(90061) == "25:01:01"
    for text in ("07:59", "25:10", "13:04:05"):
        assert format_time(parse_time(text)) == text
    with pytest.raises(ValidationError):
        format_time(-1)


def test_as_seconds():
    assert as_seconds("01:00") == 3600
    assert as_seconds(42) == 42
    assert as_seconds(0) == 0
    with pytest.raises(ValidationError):
        as_seconds(-5)


def test_service_runs_on():
    service = Service("WK", frozenset(range(5)), date(2024, 1, 1), date(2024, 1, 31),
                      added=frozenset({date(2024, 2, 3)}), removed=frozenset({date(2024, 1, 9)}))
    assert service.runs_on(date(2024, 1, 1))
    assert service.runs_on(date(2024, 1, 31))
    assert not service.runs_on(date(2024, 1, 6))
    assert not service.runs_on(date(2024, 1, 9))
    assert service.runs_on(date(2024, 1, 10))
    assert not service.runs_on(date(2023, 12, 29))
    assert not service.runs_on(date(2024, 2, 1))
    assert service.runs_on(date(2024, 2, 3))


def test_service_validation():
    day = date(2024, 1, 1)
    with pytest.raises(ValidationError, match="ends before"):
        Service("S", frozenset({0}), day, date(2023, 12, 31))
    with pytest.raises(ValidationError, match="weekdays"):
        Service("S", frozenset({7}), day, day)
    with pytest.raises(ValidationError, match="both adds and removes"):
        Service("S", frozenset({0}), day, day, frozenset({day}), frozenset({day}))
    assert Service("S", frozenset(), day, day).runs_on(day) is False


def test_stop_time_and_trip_validation():
    with pytest.raises(ValidationError, match="before the arrival"):
        StopTime("A", 100, 99)
    with pytest.raises(ValidationError, match="negative"):
        StopTime("A", -1, 0)
    with pytest.raises(ValidationError, match="at least two"):
        Trip("t", "R", "S", (StopTime("A", 0, 0),))
    with pytest.raises(ValidationError, match="arrives at B before leaving A"):
        Trip("t", "R", "S", (StopTime("A", 100, 200), StopTime("B", 150, 160)))
    trip = Trip("t", "R", "S", (StopTime("A", 100, 200), StopTime("B", 200, 260), StopTime("C", 300, 300)))
    assert (trip.departure, trip.arrival) == (200, 300)
    assert trip.stop_ids == ("A", "B", "C")


def test_make_trip():
    trip = make_trip("x", "R", "S", [("A", "08:00"), ("B", "08:07")], "Harbour")
    assert trip.stop_times == (StopTime("A", 28800, 28800), StopTime("B", 29220, 29220))
    assert trip.headsign == "Harbour"


def _small_timetable():
    tt = Timetable()
    tt.add_stop(Stop("A", "Alpha", 0, 0))
    tt.add_stop(Stop("B", "Beta", 0, 0.01))
    tt.add_route(Route("R", "9"))
    tt.add_service(Service("S", frozenset({0}), date(2024, 1, 1), date(2024, 12, 31)))
    return tt


def test_timetable_add_checks_references():
    tt = _small_timetable()
    with pytest.raises(ValidationError, match="stop 'A' already exists"):
        tt.add_stop(Stop("A", "Again", 1, 1))
    with pytest.raises(ValidationError, match="unknown route 'Q'"):
        tt.add_trip(make_trip("t", "Q", "S", [("A", "08:00"), ("B", "08:05")]))
    with pytest.raises(ValidationError, match="unknown service 'Q'"):
        tt.add_trip(make_trip("t", "R", "Q", [("A", "08:00"), ("B", "08:05")]))
    with pytest.raises(UnknownStopError, match="unknown stop 'Z'"):
        tt.add_trip(make_trip("t", "R", "S", [("A", "08:00"), ("Z", "08:05")]))
    assert tt.trips == {}
    tt.add_trip(make_trip("t", "R", "S", [("A", "08:00"), ("B", "08:05")]))
    with pytest.raises(ValidationError, match="trip 't' already exists"):
        tt.add_trip(make_trip("t", "R", "S", [("B", "09:00"), ("A", "09:05")]))
    assert list(tt.trips) == ["t"]


def test_timetable_transfers():
    tt = _small_timetable()
    tt.add_transfer("A", "B", 90)
    tt.add_transfer("B", "A", 0)
    assert tt.transfers == {("A", "B"): 90, ("B", "A"): 0}
    with pytest.raises(ValidationError, match="two different stops"):
        tt.add_transfer("A", "A", 60)
    with pytest.raises(ValidationError, match="negative"):
        tt.add_transfer("B", "A", -1)
    with pytest.raises(UnknownStopError) as info:
        tt.add_transfer("A", "Q", 60)
    assert info.value.stop_id == "Q"
    assert info.value.args == ("Q",)
    assert isinstance(info.value, KeyError)
    with pytest.raises(UnknownStopError, match="unknown stop 'P'"):
        tt.add_transfer("P", "A", 60)
    assert len(tt.transfers) == 2


def test_trips_on(timetable):
    assert [t.trip_id for t in timetable.trips_on(TUESDAY)] == ["1a", "4a", "2a", "3a", "1b", "fa", "2b", "fb", "n1"]
    assert [t.trip_id for t in timetable.trips_on(SATURDAY)] == ["1s", "n1"]
    assert [t.trip_id for t in timetable.trips_on(date(2024, 1, 1))] == ["1s", "n1"]
    assert timetable.trips_on(date(2025, 1, 1)) == []


def test_active_trips_include_last_nights_trips(timetable):
    active = timetable.active_trips(TUESDAY)
    assert active[-1] == ActiveTrip(timetable.trips["n1"], -SECONDS_PER_DAY)
    assert active[-1].run_id == "n1@-1"
    assert active[-2].run_id == "n1"
    assert active[-1].times() == [("A", -600, -600), ("D", 1800, 1860), ("G", 4200, 4200)]
    assert [a.trip.trip_id for a in timetable.active_trips(date(2025, 1, 1))] == ["n1"]
    assert timetable.active_trips(date(2025, 1, 2)) == []


def test_a_trip_ending_at_midnight_runs_into_the_next_day():
    tt = _small_timetable()
    tt.add_trip(make_trip("late", "R", "S", [("A", "23:50"), ("B", "24:00")]))
    tt.add_trip(make_trip("early", "R", "S", [("B", "23:30"), ("A", "23:59:59")]))
    monday, tuesday = date(2024, 1, 8), date(2024, 1, 9)
    assert [a.run_id for a in tt.active_trips(monday)] == ["early", "late"]
    (late,) = tt.active_trips(tuesday)
    assert late.run_id == "late@-1"
    assert late.times() == [("A", -600, -600), ("B", 0, 0)]


def test_departures(timetable):
    board = [(format_time(t), trip.trip_id) for t, trip in timetable.departures("A", TUESDAY, "08:00")]
    assert board == [("08:00", "1a"), ("08:02", "4a"), ("08:15", "1b"), ("23:50", "n1")]
    assert [trip.trip_id for _, trip in timetable.departures("A", TUESDAY, "08:01")] == ["4a", "1b", "n1"]
    assert [(t, trip.trip_id) for t, trip in timetable.departures("D", TUESDAY)] == [(1860, "n1"), (88260, "n1")]
    assert timetable.departures("G", TUESDAY) == []
    with pytest.raises(UnknownStopError):
        timetable.departures("Q", TUESDAY)
