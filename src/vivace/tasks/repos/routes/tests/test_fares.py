from dataclasses import dataclass
from typing import ClassVar

import pytest

from routes import fares
from routes.errors import FareError
from routes.fares import (
    DistanceFare,
    FareRule,
    FlatFare,
    ZoneFare,
    create_fare,
    fare_names,
    format_price,
    get_fare_class,
    parse_count,
    parse_fare,
    parse_price,
    register_fare,
)
from routes.planner import Journey, Planner, RideLeg, WalkLeg
from routes.stops import Stop
from routes.timetable import Route


def test_parse_and_format_price():
    assert parse_price("2.40") == 240
    assert parse_price("3") == 300
    assert parse_price(" 0.05 ") == 5
    assert parse_price("2.5") == 250
    assert parse_price("0") == 0
    for bad in ("2.345", "-1", "abc", "", "nan", "inf", "1,50"):
        with pytest.raises(FareError, match="invalid price"):
            parse_price(bad)
    assert format_price(240) == "2.40"
    assert format_price(5) == "0.05"
    assert format_price(0) == "0.00"
    assert format_price(-150) == "-1.50"
    assert format_price(100_000) == "1000.00"


def test_parse_count():
    assert parse_count("90") == 90
    assert parse_count("0") == 0
    for bad in ("-1", "1.5", "", "x"):
        with pytest.raises(FareError, match="invalid whole number"):
            parse_count(bad)


def test_registry():
    names = fare_names()
    assert {"flat", "zone", "distance"} <= set(names)
    assert names == sorted(names)
    assert get_fare_class("flat") is FlatFare
    assert get_fare_class("ZONE") is ZoneFare
    with pytest.raises(FareError, match="unknown fare rule 'taxi'.*known: distance, flat"):
        get_fare_class("taxi")
    with pytest.raises(ValueError, match="already registered"):
        register_fare(FlatFare)


def test_a_new_rule_can_be_registered(monkeypatch, planner):
    monkeypatch.setattr(fares, "_RULES", dict(fares._RULES))

    @register_fare
    @dataclass(frozen=True)
    class PerRide(FareRule):
        name: ClassVar[str] = "per_ride"
        parameters: ClassVar[dict] = {"price": parse_price}

        price: int

        def rides_cost(self, rides):
            return self.price * len(rides)

    rule = parse_fare("per_ride price=1.10")
    assert rule == PerRide(110)
    assert rule.cost(planner.plan("A", "F", "07:55")) == 220
    assert rule.spec() == "per_ride price=1.10"
    assert "per_ride" in fare_names()


def test_flat_fare(planner):
    rule = FlatFare(240)
    assert rule.cost(planner.plan("A", "F", "07:55")) == 240
    assert rule.cost(planner.plan("A", "D", "07:55")) == 240
    assert rule.cost(planner.plan("B", "E", "08:00")) == 0
    assert FlatFare(0).cost(planner.plan("A", "D", "07:55")) == 0
    with pytest.raises(FareError, match="price must not be negative"):
        FlatFare(-1)


def test_zone_fare_counts_every_zone_passed(planner):
    rule = ZoneFare(200, 80)
    assert rule.cost(planner.plan("A", "B", "07:55")) == 200
    assert rule.cost(planner.plan("A", "C", "07:55")) == 280
    assert rule.cost(planner.plan("A", "F", "07:55")) == 280
    assert rule.cost(planner.plan("A", "D", "07:55")) == 360
    assert rule.cost(planner.plan("A", "G", "07:55")) == 440
    assert rule.cost(planner.plan("D", "H", "08:00")) == 0
    with pytest.raises(FareError, match="per_zone must not be negative"):
        ZoneFare(200, -5)


def test_zone_fare_needs_zones():
    a, b = Stop("A", "A", 0, 0, "1"), Stop("B", "B", 0, 0.01)
    journey = Journey((RideLeg(a, b, 0, 60, "t", Route("R", "1"), "", (a, b)),))
    with pytest.raises(FareError, match="stop B has no fare zone"):
        ZoneFare(100, 10).cost(journey)
    assert FlatFare(100).cost(journey) == 100


def test_distance_fare(planner):
    rule = DistanceFare(120, 15)
    to_d = planner.plan("A", "D", "07:55")
    assert to_d.rides[0].distance == pytest.approx(3102.2, abs=0.1)
    assert rule.cost(to_d) == 120 + 4 * 15
    assert rule.cost(planner.plan("A", "B", "07:55")) == 120 + 15
    assert rule.cost(planner.plan("A", "F", "07:55")) == 120 + 4 * 15
    assert DistanceFare(120, 15, cap=170).cost(to_d) == 170
    assert DistanceFare(120, 15, cap=180).cost(to_d) == 180
    assert rule.cost(planner.plan("B", "E", "08:00")) == 0


def test_distance_fare_charges_started_kilometres():
    stops = [Stop(str(i), str(i), 0, i * 0.004498) for i in range(5)]
    step = stops[0].distance_to(stops[1])
    assert step == pytest.approx(500.15, abs=0.01)
    route = Route("R", "1")

    def ride(n):
        return Journey((RideLeg(stops[0], stops[n], 0, 60, "t", route, "", tuple(stops[: n + 1])),))

    rule = DistanceFare(100, 10)
    assert [rule.cost(ride(n)) for n in (1, 2, 3, 4)] == [110, 110, 120, 130]


def test_distance_fare_validation():
    with pytest.raises(FareError, match="cap 1.00 is below the base fare"):
        DistanceFare(120, 15, cap=100)
    assert DistanceFare(120, 15, cap=120).cap == 120
    with pytest.raises(FareError, match="base must not be negative"):
        DistanceFare(-1, 15)


def test_parse_fare_and_spec():
    assert parse_fare("flat price=2.40") == FlatFare(240)
    assert parse_fare("  zone   base=2.00 per_zone=0.80 ") == ZoneFare(200, 80)
    assert parse_fare("Distance per_km=0.15 base=1.20") == DistanceFare(120, 15)
    assert parse_fare("distance base=1.20 per_km=0.15 cap=6") == DistanceFare(120, 15, 600)
    for rule in (FlatFare(240), ZoneFare(200, 80), DistanceFare(120, 15), DistanceFare(120, 15, 600)):
        assert parse_fare(rule.spec()) == rule
    assert DistanceFare(120, 15).spec() == "distance base=1.20 per_km=0.15"
    assert ZoneFare(5, 0).spec() == "zone base=0.05 per_zone=0.00"


def test_parse_fare_errors():
    cases = [
        ("", "empty fare spec"),
        ("taxi price=1", "unknown fare rule 'taxi'"),
        ("flat price", "expected key=value, got 'price'"),
        ("flat price=", "expected key=value"),
        ("flat =1", "expected key=value"),
        ("flat cost=1", "unknown parameter 'cost'"),
        ("flat price=1 price=2", "parameter 'price' given twice"),
        ("zone base=2", "missing parameter 'per_zone'"),
        ("flat price=1.234", "invalid price"),
        ("distance base=2 per_km=0.1 cap=1", "below the base fare"),
    ]
    for spec, message in cases:
        with pytest.raises(FareError, match=message):
            parse_fare(spec)


def test_create_fare():
    assert create_fare("flat", price=100) == FlatFare(100)
    assert create_fare("distance", base=1, per_km=2, cap=None) == DistanceFare(1, 2)
    with pytest.raises(FareError, match="flat fare: unknown parameter 'cap'"):
        create_fare("flat", price=100, cap=5)
    with pytest.raises(FareError, match="flat fare: missing parameter 'price'"):
        create_fare("flat")
    with pytest.raises(FareError, match="zone fare: base must not be negative"):
        create_fare("zone", base=-1, per_zone=0)


def test_walking_is_free():
    a, b = Stop("A", "A", 0, 0, "1"), Stop("B", "B", 0, 0.01, "2")
    walk = Journey((WalkLeg(a, b, 0, 900, a.distance_to(b)),))
    for rule in (FlatFare(240), ZoneFare(200, 80), DistanceFare(120, 15)):
        assert rule.cost(walk) == 0


def test_rules_use_all_rides_of_a_journey(network):
    journey = Planner(network, min_transfer=180).plan("A", "F", "07:55")
    assert len(journey.rides) == 2
    assert ZoneFare(200, 80).cost(journey) == 280
    km = sum(ride.distance for ride in journey.rides) / 1000
    assert km == pytest.approx(2.26, abs=0.01)
    assert DistanceFare(100, 50).cost(journey) == 250
