from datetime import date

import pytest

from routes.errors import FeedError, RoutesError
from routes.gtfs import load_directory, load_feed, parse_date
from routes.timetable import StopTime, parse_time


def feed_error(feed, name, old, new):
    assert old in feed[name]
    feed[name] = feed[name].replace(old, new)
    with pytest.raises(FeedError) as info:
        load_feed(feed)
    return info.value


def test_load_sample_feed(timetable):
    assert list(timetable.stops) == ["A", "B", "C", "D", "E", "F", "G", "H"]
    assert timetable.stops["H"].name == "Ferry Pier"
    assert (timetable.stops["C"].lat, timetable.stops["C"].lon, timetable.stops["C"].zone) == (52.01, 4.01, "2")
    assert {r.route_id: r.mode for r in timetable.routes.values()} == {
        "R1": "bus", "R2": "tram", "R3": "bus", "R4": "bus", "N1": "bus", "FY": "ferry"
    }
    assert timetable.routes["FY"].name == "Ferry"
    assert len(timetable.trips) == 10
    assert timetable.transfers == {("D", "H"): 300}


def test_load_services(timetable):
    weekdays = timetable.services["WK"]
    assert weekdays.weekdays == frozenset(range(5))
    assert (weekdays.start, weekdays.end) == (date(2024, 1, 1), date(2024, 12, 31))
    assert weekdays.removed == frozenset({date(2024, 1, 1)})
    assert weekdays.added == frozenset()
    assert timetable.services["SAT"].weekdays == frozenset({5})
    assert timetable.services["SAT"].added == frozenset({date(2024, 1, 1)})
    assert timetable.services["ALL"].weekdays == frozenset(range(7))


def test_load_trips(timetable):
    trip = timetable.trips["1a"]
    assert (trip.route_id, trip.service_id, trip.headsign) == ("R1", "WK", "Harbour")
    assert trip.stop_ids == ("A", "B", "C", "D")
    assert trip.stop_times[1] == StopTime("B", parse_time("08:05"), parse_time("08:05"))
    night = timetable.trips["n1"]
    assert night.stop_times[1] == StopTime("D", parse_time("24:30"), parse_time("24:31"))
    assert night.arrival == parse_time("25:10")


def test_stop_times_are_ordered_by_sequence(feed):
    feed["stop_times.txt"] = feed["stop_times.txt"].replace("2a,08:10,08:10,E,1\n", "").replace(
        "2a,08:18,08:18,F,2\n", "2a,08:18,08:18,F,20\n2a,08:10,08:10,E,7\n"
    )
    assert load_feed(feed).trips["2a"].stop_ids == ("E", "F")


def test_missing_times_and_optional_columns(feed):
    feed["stop_times.txt"] = feed["stop_times.txt"].replace("1a,08:05,08:05,B,2", "1a,,08:06,B,2").replace(
        "1a,08:12,08:12,C,3", "1a,08:12,,C,3"
    )
    feed["trips.txt"] = feed["trips.txt"].replace("trip_id,trip_headsign", "trip_id,extra").replace(
        "1a,Harbour", "1a,ignored"
    )
    feed["routes.txt"] = feed["routes.txt"].replace("R2,2,0", "R2,2,")
    timetable = load_feed(feed)
    calls = timetable.trips["1a"].stop_times
    assert calls[1] == StopTime("B", parse_time("08:06"), parse_time("08:06"))
    assert calls[2] == StopTime("C", parse_time("08:12"), parse_time("08:12"))
    assert timetable.trips["1a"].headsign == ""
    assert timetable.routes["R2"].mode == "bus"


def test_optional_files_and_whitespace(feed):
    del feed["calendar_dates.txt"], feed["transfers.txt"]
    feed["stops.txt"] = feed["stops.txt"].replace("B,Market,52.0000,4.0100,1", ' B , "Market, north" ,52.0,4.01, 1 \n')
    feed["stops.txt"] = feed["stops.txt"].replace("stop_id,stop_name,", "stop_id , stop_name ,")
    timetable = load_feed(feed)
    assert timetable.transfers == {}
    assert timetable.services["WK"].removed == frozenset()
    assert timetable.stops["B"].name == "Market, north"
    assert timetable.stops["B"].zone == "1"


def test_load_directory(tmp_path, feed):
    for name, text in feed.items():
        if name != "transfers.txt":
            (tmp_path / name).write_text(text, encoding="utf-8")
    (tmp_path / "stops.txt").write_text("\ufeff" + feed["stops.txt"], encoding="utf-8")
    (tmp_path / "notes.txt").write_text("not part of the feed", encoding="utf-8")
    timetable = load_directory(tmp_path)
    assert list(timetable.stops)[0] == "A"
    assert len(timetable.trips) == 10
    assert timetable.transfers == {}
    (tmp_path / "trips.txt").unlink()
    with pytest.raises(FeedError, match="^trips.txt: missing file$") as info:
        load_directory(str(tmp_path))
    assert info.value.line == 0


def test_file_level_errors(feed):
    del feed["stop_times.txt"]
    with pytest.raises(FeedError, match="stop_times.txt: missing file"):
        load_feed(feed)
    feed["stop_times.txt"] = ""
    with pytest.raises(FeedError, match="stop_times.txt: file is empty"):
        load_feed(feed)


def test_missing_column_is_reported_on_the_header_line(feed):
    error = feed_error(feed, "stops.txt", "stop_lat,", "latitude,")
    assert (error.file, error.line) == ("stops.txt", 1)
    assert str(error) == "stops.txt, line 1: missing column 'stop_lat'"
    assert isinstance(error, RoutesError)


@pytest.mark.parametrize(
    "name, old, new, line, message",
    [
        ("stops.txt", "C,Museum,52.0100", "C,Museum,north", 4, "could not convert"),
        ("stops.txt", "D,Harbour,52.0200", "D,Harbour,95.0", 5, "latitude of D"),
        ("stops.txt", "E,Park", "A,Park", 6, "stop 'A' already exists"),
        ("routes.txt", "R3,3,3", "R3,3,7", 4, "unknown route_type '7'"),
        ("routes.txt", "R4,4,3", ",4,3", 5, "empty route_id"),
        ("calendar.txt", "SAT,0,0,0,0,0,1,0", "SAT,0,0,0,0,0,2,0", 3, "weekday columns must be 0 or 1"),
        ("calendar.txt", "ALL,1,1,1,1,1,1,1,20240101", "ALL,1,1,1,1,1,1,1,2024-01-01", 4, "invalid date"),
        ("calendar.txt", "SAT,0,0,0,0,0,1,0,20240101,20241231", "SAT,0,0,0,0,0,1,0,20240101,20231231", 3, "ends before"),
        ("calendar.txt", "ALL,", "WK,", 4, "service 'WK' already exists"),
        ("calendar_dates.txt", "SAT,20240101,1", "SUN,20240101,1", 3, "unknown service 'SUN'"),
        ("calendar_dates.txt", "SAT,20240101,1", "SAT,20240101,3", 3, "exception_type must be 1 or 2"),
        ("calendar_dates.txt", "WK,20240101,2", "WK,20240230,2", 2, "invalid date '20240230'"),
        ("trips.txt", "R3,WK,3a", "R9,WK,3a", 7, "unknown route 'R9'"),
        ("trips.txt", "R4,WK,4a", "R4,XX,4a", 8, "unknown service 'XX'"),
        ("trips.txt", "R2,WK,2b", "R2,WK,2a", 6, "trip '2a' already exists"),
        ("stop_times.txt", "1b,08:20,08:20,B,2", "1x,08:20,08:20,B,2", 7, "unknown trip '1x'"),
        ("stop_times.txt", "1b,08:27,08:27,C,3", "1b,08:27,08:27,Q,3", 8, "unknown stop 'Q'"),
        ("stop_times.txt", "2a,08:18,08:18,F,2", "2a,8.18,8.18,F,2", 13, "invalid time '8.18'"),
        ("stop_times.txt", "3a,08:17,08:17,F,2", "3a,,,F,2", 17, "needs an arrival or a departure"),
        ("stop_times.txt", "3a,08:17,08:17,F,2", "3a,08:17,08:17,F,one", 17, "invalid stop_sequence 'one'"),
        ("stop_times.txt", "4a,08:40,08:40,F,2", "4a,08:40,08:40,F,1", 19, "stop_sequence 1 repeats in trip '4a'"),
        ("stop_times.txt", "2b,08:33,08:33,F,2", "2b,08:33,08:30,F,2", 15, "departure from F is before"),
        ("transfers.txt", "D,H,2,300", "D,H,2,five", 2, "invalid min_transfer_time 'five'"),
        ("transfers.txt", "D,H,2,300", "D,Q,2,300", 2, "unknown stop 'Q'"),
        ("transfers.txt", "D,H,2,300", "D,D,2,300", 2, "two different stops"),
    ],
    ids=[
        "bad-lat-text",
        "lat-out-of-range",
        "duplicate-stop",
        "route-type",
        "empty-route-id",
        "weekday-flag",
        "calendar-date",
        "service-ends-early",
        "duplicate-service",
        "dates-unknown-service",
        "exception-type",
        "dates-bad-date",
        "trip-unknown-route",
        "trip-unknown-service",
        "duplicate-trip",
        "unknown-trip",
        "unknown-stop",
        "bad-time",
        "no-times",
        "bad-sequence",
        "repeated-sequence",
        "departure-before-arrival",
        "transfer-time",
        "transfer-unknown-stop",
        "transfer-same-stop",
    ],
)
def test_row_errors_name_file_and_line(feed, name, old, new, line, message):
    error = feed_error(feed, name, old, new)
    assert (error.file, error.line) == (name, line)
    assert str(error).startswith(f"{name}, line {line}: ")
    assert message in str(error)


def test_trip_errors_point_at_the_trip(feed):
    original = feed["stop_times.txt"]
    error = feed_error(feed, "stop_times.txt", "3a,08:17,08:17,F,2\n", "")
    assert (error.file, error.line) == ("trips.txt", 7)
    assert "trip 3a needs at least two stop times" in str(error)
    feed["stop_times.txt"] = original
    error = feed_error(feed, "stop_times.txt", "fb,09:50,09:50,G,2", "fb,09:50,09:50,G,2\n\nfb,09:40,09:40,A,3")
    assert (error.file, error.line) == ("trips.txt", 11)
    assert "arrives at A before leaving G" in str(error)


def test_blank_lines_keep_line_numbers(feed):
    feed["stops.txt"] = feed["stops.txt"].replace("C,Museum", "\n\nC,Museum").replace("F,Station,52.0100", "F,Station,x")
    with pytest.raises(FeedError) as info:
        load_feed(feed)
    assert info.value.line == 9


def test_parse_date():
    assert parse_date("20240229") == date(2024, 2, 29)
    for bad in ("20230229", "2024022", "2024-02-2", "20241301"):
        with pytest.raises(ValueError):
            parse_date(bad)
