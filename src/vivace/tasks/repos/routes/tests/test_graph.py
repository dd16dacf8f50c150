from datetime import date

import pytest

from routes.errors import UnknownStopError, ValidationError
from routes.graph import Connection, Footpath, Network
from routes.stops import Stop
from routes.timetable import Route, Service, Timetable, format_time, make_trip, parse_time

TUESDAY = date(2024, 3, 5)
SATURDAY = date(2024, 3, 9)


def test_connections_are_sorted_by_departure(network):
    assert len(network.connections) == 15
    departures = [c.departure for c in network.connections]
    assert departures == sorted(departures)
    assert network.connections[0] == Connection(1860, 4200, "n1@-1", 1, "D", "G")
    assert network.connections[1] == Connection(parse_time("08:00"), parse_time("08:05"), "1a", 0, "A", "B")
    assert network.connections[-1] == Connection(parse_time("24:31"), parse_time("25:10"), "n1", 1, "D", "G")
    assert network.connections[1].duration == 300
    assert set(network.runs) == {"1a", "1b", "2a", "2b", "3a", "4a", "n1", "n1@-1", "fa", "fb"}


def test_connections_of_another_day(timetable):
    saturday = Network.build(timetable, SATURDAY)
    assert [(c.run_id, c.from_stop, c.to_stop) for c in saturday.connections] == [
        ("n1@-1", "D", "G"),
        ("1s", "A", "D"),
        ("n1", "A", "D"),
        ("n1", "D", "G"),
    ]
    assert saturday.day == SATURDAY


def test_last_nights_connections_from_midnight_on():
    tt = Timetable()
    for i, stop_id in enumerate("XYZ"):
        tt.add_stop(Stop(stop_id, stop_id, 0, i))
    tt.add_route(Route("N", "N"))
    tt.add_service(Service("MON", frozenset({0}), date(2024, 3, 4), date(2024, 3, 4)))
    tt.add_trip(make_trip("night", "N", "MON", [("X", "23:50"), ("Y", "24:00"), ("Z", "24:10")]))
    tuesday = Network.build(tt, TUESDAY)
    assert tuesday.connections == [Connection(0, 600, "night@-1", 1, "Y", "Z")]
    monday = Network.build(tt, date(2024, 3, 4))
    assert [(c.departure, c.from_stop) for c in monday.connections] == [(parse_time("23:50"), "X"), (parse_time("24:00"), "Y")]


def test_first_connection_and_window(network):
    assert network.first_connection(0) == 0
    assert network.first_connection(1860) == 0
    assert network.first_connection(1861) == 1
    assert network.first_connection(parse_time("30:00")) == 15
    window = network.connections_between(parse_time("08:10"), parse_time("08:15"))
    assert [(c.run_id, format_time(c.departure)) for c in window] == [("2a", "08:10"), ("1a", "08:12"), ("3a", "08:14")]
    assert network.connections_between(parse_time("08:15"), parse_time("08:15")) == []


def test_computed_and_explicit_footpaths(network):
    (to_park,) = network.footpaths_from("B")
    assert (to_park.to_stop, to_park.duration) == ("E", 267)
    assert to_park.distance == pytest.approx(333.6, abs=0.1)
    assert network.footpaths_from("E") == [Footpath("E", "B", 267, to_park.distance)]
    (to_pier,) = network.footpaths_from("D")
    assert (to_pier.to_stop, to_pier.duration) == ("H", 300)
    assert [(p.to_stop, p.duration) for p in network.footpaths_from("H")] == [("D", 45)]
    assert network.footpaths_from("A") == []
    assert network.footpaths_from("G") == []


def test_walk_radius_and_speed(timetable):
    wide = Network.build(timetable, TUESDAY, walk_radius=770)
    assert [(p.to_stop, p.duration) for p in wide.footpaths_from("A")] == [("B", 548), ("E", 610)]
    assert [(p.to_stop, p.duration) for p in wide.footpaths_from("B")] == [("E", 267), ("A", 548)]
    slow = Network.build(timetable, TUESDAY, walk_speed=1.0)
    assert [(p.to_stop, p.duration) for p in slow.footpaths_from("B")] == [("E", 334)]
    none = Network.build(timetable, TUESDAY, walk_radius=0)
    assert none.footpaths_from("B") == []
    assert [(p.to_stop, p.duration) for p in none.footpaths_from("D")] == [("H", 300)]
    with pytest.raises(ValidationError, match="walk radius"):
        Network.build(timetable, TUESDAY, walk_radius=-1)


def test_explicit_transfer_beyond_the_radius(timetable):
    timetable.add_transfer("A", "G", 1200)
    network = Network.build(timetable, TUESDAY)
    assert [(p.to_stop, p.duration) for p in network.footpaths_from("A")] == [("G", 1200)]
    assert network.footpaths_from("A")[0].distance > 10_000
    assert network.footpaths_from("G") == []


def test_footpaths_must_join_known_stops(network):
    stops = {"A": network.stop("A"), "B": network.stop("B")}
    Network(TUESDAY, stops, {}, {}, [], [Footpath("A", "B", 60, 684.6)])
    with pytest.raises(UnknownStopError, match="'Q'"):
        Network(TUESDAY, stops, {}, {}, [], [Footpath("A", "Q", 60, 1.0)])
    with pytest.raises(UnknownStopError, match="'Q'"):
        Network(TUESDAY, stops, {}, {}, [], [Footpath("Q", "A", 60, 1.0)])


def test_stop_lookups_and_run_stops(network):
    assert network.stop("C").name == "Museum"
    with pytest.raises(UnknownStopError):
        network.stop("Q")
    with pytest.raises(UnknownStopError):
        network.footpaths_from("Q")
    assert [s.stop_id for s in network.run_stops("1a", 0, 2)] == ["A", "B", "C", "D"]
    assert [s.stop_id for s in network.run_stops("1a", 1, 1)] == ["B", "C"]
    assert [s.stop_id for s in network.run_stops("n1@-1", 1, 1)] == ["D", "G"]
