from datetime import date

import pytest

from routes.errors import NoRouteError, RoutesError, UnknownStopError, ValidationError
from routes.graph import Network
from routes.planner import Journey, Planner, RideLeg, WalkLeg
from routes.stops import Stop
from routes.timetable import Route, Service, Timetable, format_time, make_trip, parse_time

TUESDAY = date(2024, 3, 5)


def summary(journey):
    return [
        (type(leg).__name__[:-3], leg.origin.stop_id, leg.destination.stop_id, format_time(leg.departure), format_time(leg.arrival))
        for leg in journey.legs
    ]


def test_earliest_arrival_with_one_change(planner):
    journey = planner.plan("A", "F", "07:55")
    assert summary(journey) == [("Ride", "A", "C", "08:00", "08:12"), ("Ride", "C", "F", "08:14", "08:17")]
    assert (journey.departure, journey.arrival) == (parse_time("08:00"), parse_time("08:17"))
    assert journey.duration == 17 * 60
    assert journey.transfers == 1
    assert journey.walking_distance == 0
    assert (journey.origin.stop_id, journey.destination.stop_id) == ("A", "F")
    first, second = journey.rides
    assert (first.trip_id, first.route.name, first.headsign, first.hops) == ("1a", "1", "Harbour", 2)
    assert [s.stop_id for s in first.stops] == ["A", "B", "C"]
    assert (second.trip_id, second.route.mode, second.hops) == ("3a", "bus", 1)


def test_minimum_transfer_time_is_inclusive(network):
    assert Planner(network, min_transfer=120).plan("A", "F", "07:55").arrival == parse_time("08:17")
    journey = Planner(network, min_transfer=121).plan("A", "F", "07:55")
    assert summary(journey) == [
        ("Ride", "A", "B", "08:00", "08:05"),
        ("Walk", "B", "E", "08:05", "08:09:27"),
        ("Ride", "E", "F", "08:10", "08:18"),
    ]
    assert journey.transfers == 1
    assert journey.walking_distance == pytest.approx(333.6, abs=0.1)
    assert journey.legs[1].duration == 267


def test_staying_on_a_trip_needs_no_transfer_time(network):
    journey = Planner(network, min_transfer=900).plan("A", "D", "07:55")
    assert summary(journey) == [("Ride", "A", "D", "08:00", "08:20")]
    assert journey.rides[0].hops == 3
    assert journey.transfers == 0


def test_transfer_limit(network):
    journey = Planner(network, max_transfers=0).plan("A", "F", "07:55")
    assert summary(journey) == [("Ride", "A", "F", "08:02", "08:40")]
    assert journey.rides[0].trip_id == "4a"
    assert Planner(network, max_transfers=1).plan("A", "F", "07:55").arrival == parse_time("08:17")
    assert summary(Planner(network, max_transfers=0).plan("A", "G", "07:55")) == [("Ride", "A", "G", "23:50", "25:10")]
    assert Planner(network, max_transfers=1).plan("A", "G", "07:55").transfers == 1


def test_first_walk_leaves_as_late_as_possible(network):
    journey = Planner(network, min_transfer=180).plan("B", "F", "08:00")
    assert summary(journey) == [("Walk", "B", "E", "08:05:33", "08:10"), ("Ride", "E", "F", "08:10", "08:18")]
    assert journey.departure == parse_time("08:05:33")
    assert journey.transfers == 0
    assert Planner(network).plan("B", "F", "08:00").arrival == parse_time("08:17")


def test_walking_from_the_origin_takes_time(planner):
    journey = planner.plan("B", "F", "08:06")
    assert summary(journey) == [("Walk", "B", "E", "08:20:33", "08:25"), ("Ride", "E", "F", "08:25", "08:33")]
    assert journey.rides[0].trip_id == "2b"


def test_walk_only_journey(planner):
    journey = planner.plan("B", "E", "08:00")
    assert summary(journey) == [("Walk", "B", "E", "08:00", "08:04:27")]
    assert journey.rides == ()
    assert journey.transfers == 0
    assert isinstance(journey.legs[0], WalkLeg)


def test_journey_ending_with_an_explicit_transfer(planner):
    journey = planner.plan("A", "H", "07:55")
    assert summary(journey) == [("Ride", "A", "D", "08:00", "08:20"), ("Walk", "D", "H", "08:20", "08:25")]
    assert journey.walking_distance == pytest.approx(55.6, abs=0.1)


def test_explicit_transfer_time_replaces_walking_estimate(planner, timetable):
    journey = planner.plan("A", "G", "07:55")
    assert summary(journey)[-1] == ("Ride", "H", "G", "09:10", "09:50")
    del timetable.transfers[("D", "H")]
    quick = Planner(Network.build(timetable, TUESDAY)).plan("A", "G", "07:55")
    assert summary(quick) == [
        ("Ride", "A", "D", "08:00", "08:20"),
        ("Walk", "D", "H", "08:20", "08:20:45"),
        ("Ride", "H", "G", "08:23", "09:00"),
    ]


def test_trips_past_midnight(planner):
    late = planner.plan("A", "G", "23:00")
    assert summary(late) == [("Ride", "A", "G", "23:50", "25:10")]
    early = planner.plan("D", "G", "00:00")
    assert summary(early) == [("Ride", "D", "G", "00:31", "01:10")]
    assert early.rides[0].trip_id == "n1"
    assert planner.plan("D", "G", 1861).arrival == parse_time("09:00")
    assert planner.plan("D", "G", "09:11").departure == parse_time("24:31")


def test_depart_at_is_inclusive(planner):
    assert planner.plan("A", "D", "08:00").arrival == parse_time("08:20")
    assert planner.plan("A", "D", parse_time("08:00") + 1).arrival == parse_time("08:35")
    assert planner.plan("A", "D", "08:01").rides[0].trip_id == "1b"


def test_no_route(planner):
    with pytest.raises(NoRouteError, match="no route from 'G' to 'A'") as info:
        planner.plan("G", "A", "08:00")
    assert (info.value.origin, info.value.destination) == ("G", "A")
    with pytest.raises(NoRouteError):
        planner.plan("A", "F", "08:16")
    with pytest.raises(RoutesError):
        planner.plan("C", "D", "08:30")


def test_plan_validation(planner, network):
    with pytest.raises(ValidationError, match="same stop"):
        planner.plan("A", "A", "08:00")
    with pytest.raises(UnknownStopError):
        planner.plan("Q", "A", "08:00")
    with pytest.raises(UnknownStopError):
        planner.plan("A", "Q", "08:00")
    with pytest.raises(ValidationError):
        planner.plan("A", "D", "8h")
    with pytest.raises(ValidationError, match="transfer time"):
        Planner(network, min_transfer=-1)
    assert Planner(network, min_transfer=0, max_transfers=0).plan("A", "C", "07:00").arrival == parse_time("08:12")
    with pytest.raises(ValidationError, match="number of transfers"):
        Planner(network, max_transfers=-1)


def test_earliest_arrivals(planner):
    arrivals = {stop: format_time(t) for stop, t in planner.earliest_arrivals("A", "07:55").items()}
    assert arrivals == {
        "A": "07:55",
        "B": "08:05",
        "E": "08:09:27",
        "C": "08:12",
        "F": "08:17",
        "D": "08:20",
        "H": "08:25",
        "G": "09:50",
    }
    assert planner.earliest_arrivals("G", "08:00") == {"G": parse_time("08:00")}
    later = {stop: format_time(t) for stop, t in planner.earliest_arrivals("B", "08:15").items()}
    assert later == {
        "B": "08:15",
        "E": "08:19:27",
        "C": "08:27",
        "F": "08:33",
        "D": "08:35",
        "H": "08:40",
        "G": "09:50",
    }


def _tie_network():
    tt = Timetable()
    for i, stop_id in enumerate("PQRS"):
        tt.add_stop(Stop(stop_id, stop_id * 3, 50.0, 5.0 + i * 0.1))
    tt.add_route(Route("L", "L"))
    tt.add_service(Service("S", frozenset({1}), TUESDAY, TUESDAY))
    tt.add_trip(make_trip("slow", "L", "S", [("P", "10:00"), ("Q", "10:10"), ("R", "10:30"), ("S", "10:50")]))
    tt.add_trip(make_trip("same", "L", "S", [("Q", "10:12"), ("R", "10:30")]))
    tt.add_trip(make_trip("fast", "L", "S", [("Q", "10:13"), ("S", "10:45")]))
    return Network.build(tt, TUESDAY)


def test_equal_arrivals_prefer_fewer_rides():
    planner = Planner(_tie_network())
    to_r = planner.plan("P", "R", "09:00")
    assert summary(to_r) == [("Ride", "P", "R", "10:00", "10:30")]
    to_s = planner.plan("P", "S", "09:00")
    assert summary(to_s) == [("Ride", "P", "Q", "10:00", "10:10"), ("Ride", "Q", "S", "10:13", "10:45")]
    assert Planner(_tie_network(), min_transfer=200).plan("P", "S", "09:00").arrival == parse_time("10:50")


def test_describe(network):
    journey = Planner(network, min_transfer=180).plan("A", "F", "07:55")
    assert journey.describe().splitlines() == [
        "08:00 bus 1 towards Harbour from Central to Market (1 stop), arrive 08:05",
        "08:05 walk 334 m from Market to Park, arrive 08:09:27",
        "08:10 tram 2 towards Station from Park to Station (1 stop), arrive 08:18",
    ]
    assert Planner(network).plan("A", "D", "07:00").describe() == (
        "08:00 bus 1 towards Harbour from Central to Harbour (3 stops), arrive 08:20"
    )


def test_journey_validation():
    a, b, c = Stop("A", "A", 0, 0), Stop("B", "B", 0, 0.001), Stop("C", "C", 0, 0.002)
    route = Route("R", "7")
    ride = RideLeg(a, b, 100, 200, "t", route, "", (a, b))
    assert ride.duration == 100
    assert ride.distance == pytest.approx(a.distance_to(b))
    with pytest.raises(ValidationError, match="at least one leg"):
        Journey(())
    with pytest.raises(ValidationError, match="does not start where"):
        Journey((ride, WalkLeg(c, a, 200, 260, 222.0)))
    with pytest.raises(ValidationError, match="leaves before"):
        Journey((ride, WalkLeg(b, c, 199, 260, 111.0)))
    journey = Journey((ride, WalkLeg(b, c, 200, 260, 111.0)))
    assert (journey.duration, journey.transfers, journey.walking_distance) == (160, 0, 111.0)
