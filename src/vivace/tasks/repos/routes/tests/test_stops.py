import math

import pytest

from routes.errors import RoutesError, ValidationError
from routes.stops import EARTH_RADIUS_M, Stop, haversine, stops_within, walking_seconds

A = Stop("A", "Central", 52.0, 4.0, "1")
B = Stop("B", "Market", 52.0, 4.01, "1")
E = Stop("E", "Park", 52.003, 4.01)


def test_haversine_known_distances():
    one_degree = 2 * math.pi * EARTH_RADIUS_M / 360
    assert haversine(0, 0, 0, 1) == pytest.approx(one_degree)
    assert haversine(0, 0, 1, 0) == pytest.approx(one_degree)
    assert haversine(10, 20, 10, 20) == 0
    assert haversine(0, 0, 0, 180) == pytest.approx(math.pi * EARTH_RADIUS_M)
    assert haversine(52, 4, 53, 5) == pytest.approx(haversine(53, 5, 52, 4))
    assert haversine(52.0, 4.0, 52.0, 4.01) == pytest.approx(684.6, abs=0.1)


def test_stop_distance_is_symmetric():
    assert A.distance_to(B) == pytest.approx(684.6, abs=0.1)
    assert B.distance_to(A) == pytest.approx(A.distance_to(B))
    assert B.distance_to(E) == pytest.approx(333.6, abs=0.1)
    assert A.distance_to(A) == 0


def test_stop_validation():
    assert Stop("X", "Edge", 90.0, -180.0).lat == 90.0
    assert Stop("Y", "Edge", -90.0, 180.0).lon == 180.0
    for bad in (("", "No id", 0, 0), (" X", "Padded", 0, 0), ("X", "North", 90.5, 0), ("X", "West", 0, -180.1)):
        with pytest.raises(ValidationError):
            Stop(*bad)
    with pytest.raises(RoutesError, match="latitude of Q"):
        Stop("Q", "Nowhere", -91, 0)
    assert Stop("Z", "Zoned", 1, 1, "3").zone == "3"
    assert Stop("Z", "Zoneless", 1, 1).zone == ""


def test_walking_seconds_rounds_up():
    assert walking_seconds(0) == 0
    assert walking_seconds(125) == 100
    assert walking_seconds(125.01) == 101
    assert walking_seconds(333.58) == 267
    assert walking_seconds(100, speed=2) == 50
    assert walking_seconds(101, speed=2) == 51
    with pytest.raises(ValidationError, match="speed"):
        walking_seconds(100, speed=0)
    with pytest.raises(ValidationError, match="distance"):
        walking_seconds(-1)


def test_stops_within_sorted_by_distance():
    far = Stop("F", "Far", 52.1, 4.1)
    twin = Stop("E2", "Park twin", 52.003, 4.01)
    found = stops_within([A, B, E, far, twin], B, 700)
    assert [(stop.stop_id, round(d)) for stop, d in found] == [("E", 334), ("E2", 334), ("A", 685)]
    assert [s.stop_id for s, _ in stops_within([A, B, E], B, 684.0)] == ["E"]
    assert stops_within([A, B, E], B, 0) == []
    assert stops_within([B], B, 10_000) == []
    with pytest.raises(ValidationError):
        stops_within([A], B, -1)


def test_stops_within_radius_is_inclusive():
    distance = B.distance_to(E)
    assert [s.stop_id for s, _ in stops_within([E], B, distance)] == ["E"]
    assert stops_within([E], B, distance - 0.01) == []
