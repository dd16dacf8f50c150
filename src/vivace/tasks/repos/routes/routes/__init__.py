"""Public-transit routing: timetables, walking transfers, journey planning and fares."""

from .errors import FareError, FeedError, NoRouteError, RoutesError, TimeFormatError, UnknownStopError, ValidationError
from .fares import FareRule, create_fare, fare_names, format_price, parse_fare, parse_price, register_fare
from .graph import Connection, Footpath, Network
from .gtfs import load_directory, load_feed
from .planner import Journey, Leg, Planner, RideLeg, WalkLeg
from .stops import Stop, haversine, stops_within, walking_seconds
from .timetable import Route, Service, StopTime, Timetable, Trip, format_time, make_trip, parse_time

__all__ = [
    "Connection",
    "FareError",
    "FareRule",
    "FeedError",
    "Footpath",
    "Journey",
    "Leg",
    "Network",
    "NoRouteError",
    "Planner",
    "RideLeg",
    "Route",
    "RoutesError",
    "Service",
    "Stop",
    "StopTime",
    "TimeFormatError",
    "Timetable",
    "Trip",
    "UnknownStopError",
    "ValidationError",
    "WalkLeg",
    "create_fare",
    "fare_names",
    "format_price",
    "format_time",
    "haversine",
    "load_directory",
    "load_feed",
    "make_trip",
    "parse_fare",
    "parse_price",
    "parse_time",
    "register_fare",
    "stops_within",
    "walking_seconds",
]
