from datetime import date

import pytest

from routes.errors import NoRouteError, UnknownStopError, ValidationError
from routes.graph import Network
from routes.planner import Planner, WalkLeg
from routes.stops import Stop
from routes.timetable import Route, Service, Timetable, format_time, make_trip, parse_time

TUESDAY = date(2024, 3, 5)


def summary(journey):
    return [
        (type(leg).__name__[:-3], leg.origin.stop_id, leg.destination.stop_id, format_time(leg.departure), format_time(leg.arrival))
        for leg in journey.legs
    ]


def test_latest_departure_arriving_in_time(planner):
    journey = planner.latest_departure("A", "F", "08:40")
    assert summary(journey) == [
        ("Ride", "A", "B", "08:15", "08:20"),
        ("Walk", "B", "E", "08:20", "08:24:27"),
        ("Ride", "E", "F", "08:25", "08:33"),
    ]
    assert journey.departure == parse_time("08:15")
    assert journey.arrival == parse_time("08:33")
    assert journey.transfers == 1


def test_arrive_by_is_inclusive(planner):
    assert planner.latest_departure("A", "F", "08:33").departure == parse_time("08:15")
    earlier = planner.latest_departure("A", "F", "08:32")
    assert summary(earlier) == [("Ride", "A", "C", "08:00", "08:12"), ("Ride", "C", "F", "08:14", "08:17")]
    assert planner.latest_departure("A", "F", parse_time("08:17")).departure == parse_time("08:00")
    with pytest.raises(NoRouteError):
        planner.latest_departure("A", "F", parse_time("08:17") - 1)


def test_transfer_rules_apply(network):
    direct = Planner(network, max_transfers=0).latest_departure("A", "F", "09:00")
    assert summary(direct) == [("Ride", "A", "F", "08:02", "08:40")]
    slow_change = Planner(network, min_transfer=180).latest_departure("A", "F", "08:20")
    assert summary(slow_change) == [
        ("Ride", "A", "B", "08:00", "08:05"),
        ("Walk", "B", "E", "08:05", "08:09:27"),
        ("Ride", "E", "F", "08:10", "08:18"),
    ]
    with pytest.raises(NoRouteError):
        Planner(network, max_transfers=0).latest_departure("A", "F", "08:39")


def test_first_walk_leaves_as_late_as_possible(planner):
    journey = planner.latest_departure("B", "F", "08:40")
    assert summary(journey) == [("Walk", "B", "E", "08:20:33", "08:25"), ("Ride", "E", "F", "08:25", "08:33")]
    assert journey.departure == parse_time("08:20:33")
    ferry = planner.latest_departure("D", "G", "09:30")
    assert summary(ferry) == [("Walk", "D", "H", "08:18", "08:23"), ("Ride", "H", "G", "08:23", "09:00")]


def test_walking_all_the_way(planner):
    journey = planner.latest_departure("B", "E", "09:00")
    assert len(journey.legs) == 1
    assert isinstance(journey.legs[0], WalkLeg)
    assert (journey.departure, journey.arrival) == (parse_time("08:55:33"), parse_time("09:00"))


def test_trips_past_midnight(planner):
    assert summary(planner.latest_departure("D", "G", "02:00")) == [("Ride", "D", "G", "00:31", "01:10")]
    assert summary(planner.latest_departure("D", "G", "25:10")) == [("Ride", "D", "G", "24:31", "25:10")]
    assert summary(planner.latest_departure("A", "G", "26:00")) == [("Ride", "A", "G", "23:50", "25:10")]


def test_no_route_and_validation(planner):
    with pytest.raises(NoRouteError, match="no route from 'A' to 'F'"):
        planner.latest_departure("A", "F", "08:10")
    with pytest.raises(NoRouteError):
        planner.latest_departure("G", "A", "23:00")
    with pytest.raises(ValidationError, match="same stop"):
        planner.latest_departure("A", "A", "09:00")
    with pytest.raises(UnknownStopError):
        planner.latest_departure("Q", "A", "09:00")
    with pytest.raises(UnknownStopError):
        planner.latest_departure("A", "Q", "09:00")


def test_matches_plan_from_the_departure_time(planner):
    checked = 0
    for origin in "ABCDEH":
        for destination in "BCDEFGH":
            if origin == destination:
                continue
            for arrive_by in ("08:20", "08:35", "09:00", "10:00"):
                deadline = parse_time(arrive_by)
                try:
                    journey = planner.latest_departure(origin, destination, arrive_by)
                except NoRouteError:
                    try:
                        earliest = planner.plan(origin, destination, 0)
                    except NoRouteError:
                        continue
                    assert earliest.arrival > deadline, f"{origin}->{destination} by {arrive_by}: missed a journey"
                    continue
                checked += 1
                assert journey.arrival <= deadline
                assert summary(journey) == summary(planner.plan(origin, destination, journey.departure))
                try:
                    later = planner.plan(origin, destination, journey.departure + 1)
                except NoRouteError:
                    continue
                assert later.arrival > deadline, f"{origin}->{destination} by {arrive_by}"
    assert checked >= 80


def test_ties_are_resolved_like_plan():
    tt = Timetable()
    for i, stop_id in enumerate("PQRS"):
        tt.add_stop(Stop(stop_id, stop_id * 3, 50.0, 5.0 + i * 0.1))
    tt.add_route(Route("L", "L"))
    tt.add_service(Service("S", frozenset({1}), TUESDAY, TUESDAY))
    tt.add_trip(make_trip("slow", "L", "S", [("P", "10:00"), ("Q", "10:10"), ("R", "10:30"), ("S", "10:50")]))
    tt.add_trip(make_trip("same", "L", "S", [("Q", "10:12"), ("R", "10:30")]))
    tt.add_trip(make_trip("fast", "L", "S", [("Q", "10:13"), ("S", "10:45")]))
    planner = Planner(Network.build(tt, TUESDAY))
    assert summary(planner.latest_departure("P", "R", "11:00")) == [("Ride", "P", "R", "10:00", "10:30")]
    assert summary(planner.latest_departure("P", "S", "10:50")) == [
        ("Ride", "P", "Q", "10:00", "10:10"),
        ("Ride", "Q", "S", "10:13", "10:45"),
    ]
    assert summary(planner.latest_departure("Q", "S", "10:50")) == [("Ride", "Q", "S", "10:13", "10:45")]
    assert summary(planner.latest_departure("Q", "R", "10:30")) == [("Ride", "Q", "R", "10:12", "10:30")]
