import pytest

from routes.errors import FareError
from routes.fares import create_fare, fare_names, get_fare_class, parse_fare
from routes.planner import Journey, Planner, RideLeg, WalkLeg
from routes.stops import Stop
from routes.timetable import Route, parse_time

STOPS = [Stop(s, s, 0, i * 0.01, "1") for i, s in enumerate("ABCDEF")]
ROUTE = Route("R", "7")


def journey(*rides):
    """Rides between consecutive stops, each given as (departure, minutes long); the
    departure is "HH:MM" or seconds."""
    legs = []
    for i, (departure, minutes) in enumerate(rides):
        start = parse_time(departure) if isinstance(departure, str) else departure
        a, b = STOPS[i], STOPS[i + 1]
        legs.append(RideLeg(a, b, start, start + minutes * 60, f"t{i}", ROUTE, "", (a, b)))
    return Journey(tuple(legs))


def test_timed_is_a_registered_rule():
    assert "timed" in fare_names()
    assert {"flat", "zone", "distance"} <= set(fare_names())
    rule = create_fare("timed", price=200, minutes=90)
    assert (rule.name, rule.price, rule.minutes) == ("timed", 200, 90)
    assert get_fare_class("TIMED") is type(rule)
    assert parse_fare("timed price=2.00 minutes=90") == rule


def test_one_ticket_covers_rides_boarded_within_the_window():
    rule = create_fare("timed", price=200, minutes=60)
    assert rule.cost(journey(("08:00", 20))) == 200
    assert rule.cost(journey(("08:00", 20), ("08:25", 20), ("08:50", 30))) == 200
    assert rule.cost(journey(("08:00", 70))) == 200


def test_boarding_at_the_end_of_the_window_still_counts():
    rule = create_fare("timed", price=150, minutes=30)
    assert rule.cost(journey(("08:00", 10), ("08:30", 10))) == 150
    assert rule.cost(journey(("08:00", 10), ("08:31", 10))) == 300
    assert rule.cost(journey(("08:00", 10), (parse_time("08:30") + 1, 10))) == 300
    assert rule.cost(journey(("08:00", 10), (parse_time("08:30") - 1, 10))) == 150


def test_a_new_ticket_starts_a_new_window():
    rule = create_fare("timed", price=100, minutes=30)
    rides = journey(("08:00", 10), ("08:20", 20), ("08:45", 5), ("09:10", 5), ("09:20", 5))
    assert rule.cost(rides) == 300
    assert create_fare("timed", price=100, minutes=35).cost(rides) == 200
    rides = journey(("08:00", 10), ("08:40", 10), ("09:15", 10))
    assert rule.cost(rides) == 300
    assert create_fare("timed", price=0, minutes=30).cost(rides) == 0


def test_walking_is_free():
    a, b = STOPS[0], STOPS[1]
    walk = Journey((WalkLeg(a, b, 0, 600, a.distance_to(b)),))
    assert create_fare("timed", price=200, minutes=90).cost(walk) == 0


def test_timed_fare_for_planned_journeys(planner, network):
    two_rides = planner.plan("A", "F", "07:55")
    assert [r.departure for r in two_rides.rides] == [parse_time("08:00"), parse_time("08:14")]
    assert parse_fare("timed price=2.00 minutes=14").cost(two_rides) == 200
    assert parse_fare("timed price=2.00 minutes=13").cost(two_rides) == 400
    walk_and_tram = Planner(network, min_transfer=180).plan("A", "F", "07:55")
    assert parse_fare("timed price=1.80 minutes=10").cost(walk_and_tram) == 180
    assert parse_fare("timed price=1.80 minutes=9").cost(walk_and_tram) == 360


def test_spec_round_trip():
    rule = parse_fare("timed minutes=75 price=2.5")
    assert rule.spec() == "timed price=2.50 minutes=75"
    assert parse_fare(rule.spec()) == rule


def test_timed_fare_validation():
    with pytest.raises(FareError, match="minutes"):
        create_fare("timed", price=200, minutes=0)
    with pytest.raises(FareError, match="price"):
        create_fare("timed", price=-1, minutes=60)
    with pytest.raises(FareError, match="missing parameter 'minutes'"):
        parse_fare("timed price=2.00")
    with pytest.raises(FareError, match="invalid whole number"):
        parse_fare("timed price=2.00 minutes=1.5")
    with pytest.raises(FareError, match="unknown parameter 'cap'"):
        parse_fare("timed price=2.00 minutes=60 cap=5")
