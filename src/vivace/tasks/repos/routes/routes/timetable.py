"""Timetables: routes, services (the days a trip runs) and trips with their stop times.

Times are whole seconds after midnight of the service day. As in GTFS, a trip that runs
past midnight keeps counting: "25:10" is 01:10 on the next calendar day, still belonging
to the service day on which the trip started.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import date, timedelta

from .errors import TimeFormatError, UnknownStopError, ValidationError
from .stops import Stop

SECONDS_PER_DAY = 86_400
#: Latest hour a stop time may have; trips may run up to a day past their service day.
MAX_HOUR = 47


def parse_time(text: str) -> int:
    """Seconds after midnight for `HH:MM` or `HH:MM:SS` (hours up to 47, one digit allowed)."""
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not all(p.isdigit() for p in parts):
        raise TimeFormatError(f"invalid time {text!r}: expected HH:MM or HH:MM:SS")
    if any(len(p) != 2 for p in parts[1:]) or not 1 <= len(parts[0]) <= 2:
        raise TimeFormatError(f"invalid time {text!r}: expected HH:MM or HH:MM:SS")
    hours, minutes = int(parts[0]), int(parts[1])
    seconds = int(parts[2]) if len(parts) == 3 else 0
    if hours > MAX_HOUR or minutes > 59 or seconds > 59:
        raise TimeFormatError(f"time {text!r} is out of range")
    return hours * 3600 + minutes * 60 + seconds


def format_time(seconds: int) -> str:
    """`HH:MM`, or `HH:MM:SS` when the time is not a whole minute; hours may exceed 23."""
    if seconds < 0:
        raise ValidationError(f"time must not be negative, got {seconds}")
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if secs:
        return f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{hours:02d}:{minutes:02d}"


def as_seconds(value: int | str) -> int:
    """A time given either as seconds or as text for `parse_time`."""
    if isinstance(value, str):
        return parse_time(value)
    if value < 0:
        raise ValidationError(f"time must not be negative, got {value}")
    return value


@dataclass(frozen=True)
class Service:
    """The days a set of trips runs: the `weekdays` (0 = Monday) between `start` and
    `end` (both included), plus the `added` dates and minus the `removed` ones."""

    service_id: str
    weekdays: frozenset[int]
    start: date
    end: date
    added: frozenset[date] = frozenset()
    removed: frozenset[date] = frozenset()

    def __post_init__(self) -> None:
        if not self.service_id:
            raise ValidationError("service id must not be empty")
        if self.end < self.start:
            raise ValidationError(f"service {self.service_id} ends before it starts")
        if any(not 0 <= d <= 6 for d in self.weekdays):
            raise ValidationError(f"weekdays are 0 (Monday) to 6 (Sunday), got {sorted(self.weekdays)}")
        if self.added & self.removed:
            raise ValidationError(f"service {self.service_id} both adds and removes the same date")

    def runs_on(self, day: date) -> bool:
        if day in self.removed:
            return False
        if day in self.added:
            return True
        return self.start <= day <= self.end and day.weekday() in self.weekdays


@dataclass(frozen=True)
class Route:
    """A line as passengers know it, e.g. bus "12"."""

    route_id: str
    name: str
    mode: str = "bus"


@dataclass(frozen=True)
class StopTime:
    """A trip's call at a stop: it arrives at `arrival` and leaves at `departure`."""

    stop_id: str
    arrival: int
    departure: int

    def __post_init__(self) -> None:
        if self.arrival < 0:
            raise ValidationError(f"arrival at {self.stop_id} must not be negative")
        if self.departure < self.arrival:
            raise ValidationError(f"departure from {self.stop_id} is before the arrival")


@dataclass(frozen=True)
class Trip:
    """One run of a vehicle along a route on the days of its service."""

    trip_id: str
    route_id: str
    service_id: str
    stop_times: tuple[StopTime, ...]
    headsign: str = ""

    def __post_init__(self) -> None:
        if not self.trip_id:
            raise ValidationError("trip id must not be empty")
        if len(self.stop_times) < 2:
            raise ValidationError(f"trip {self.trip_id} needs at least two stop times")
        for before, after in zip(self.stop_times, self.stop_times[1:]):
            if after.arrival < before.departure:
                raise ValidationError(
                    f"trip {self.trip_id} arrives at {after.stop_id} before leaving {before.stop_id}"
                )

    @property
    def departure(self) -> int:
        return self.stop_times[0].departure

    @property
    def arrival(self) -> int:
        return self.stop_times[-1].arrival

    @property
    def stop_ids(self) -> tuple[str, ...]:
        return tuple(st.stop_id for st in self.stop_times)


@dataclass(frozen=True)
class ActiveTrip:
    """A trip running on some day; its times are `offset` seconds off that day's clock
    (0 for the day's own trips, minus a day for last night's trips still running)."""

    trip: Trip
    offset: int = 0

    @property
    def run_id(self) -> str:
        """Tells apart two runs of one trip on the same day (tonight's and last night's)."""
        return self.trip.trip_id if self.offset == 0 else f"{self.trip.trip_id}@{self.offset // SECONDS_PER_DAY}"

    def times(self) -> list[tuple[str, int, int]]:
        """(stop id, arrival, departure) of each call, on the day's clock."""
        return [(st.stop_id, st.arrival + self.offset, st.departure + self.offset) for st in self.trip.stop_times]


@dataclass
class Timetable:
    """Stops, routes, services and trips, with walking transfers between stops."""

    stops: dict[str, Stop] = field(default_factory=dict)
    routes: dict[str, Route] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    trips: dict[str, Trip] = field(default_factory=dict)
    #: (from stop, to stop) -> walking time in seconds, overriding the computed one.
    transfers: dict[tuple[str, str], int] = field(default_factory=dict)

    def add_stop(self, stop: Stop) -> Stop:
        _add_unique(self.stops, stop.stop_id, stop, "stop")
        return stop

    def add_route(self, route: Route) -> Route:
        _add_unique(self.routes, route.route_id, route, "route")
        return route

    def add_service(self, service: Service) -> Service:
        _add_unique(self.services, service.service_id, service, "service")
        return service

    def add_trip(self, trip: Trip) -> Trip:
        if trip.route_id not in self.routes:
            raise ValidationError(f"trip {trip.trip_id} uses unknown route {trip.route_id!r}")
        if trip.service_id not in self.services:
            raise ValidationError(f"trip {trip.trip_id} uses unknown service {trip.service_id!r}")
        for stop_id in trip.stop_ids:
            self.stop(stop_id)
        _add_unique(self.trips, trip.trip_id, trip, "trip")
        return trip

    def add_transfer(self, from_stop: str, to_stop: str, seconds: int) -> None:
        """Walking from `from_stop` to `to_stop` takes `seconds` (one direction only)."""
        self.stop(from_stop)
        self.stop(to_stop)
        if from_stop == to_stop:
            raise ValidationError(f"a transfer needs two different stops, got {from_stop!r} twice")
        if seconds < 0:
            raise ValidationError(f"transfer time must not be negative, got {seconds}")
        self.transfers[(from_stop, to_stop)] = seconds

    def stop(self, stop_id: str) -> Stop:
        try:
            return self.stops[stop_id]
        except KeyError:
            raise UnknownStopError(stop_id) from None

    def trips_on(self, day: date) -> list[Trip]:
        """Trips whose service runs on `day`, by departure time then trip id."""
        trips = [t for t in self.trips.values() if self.services[t.service_id].runs_on(day)]
        return sorted(trips, key=lambda t: (t.departure, t.trip_id))

    def active_trips(self, day: date) -> list[ActiveTrip]:
        """The trips of `day`, then the trips of the day before that are still running
        after midnight (shifted back by a day)."""
        active = [ActiveTrip(t) for t in self.trips_on(day)]
        for trip in self.trips_on(day - timedelta(days=1)):
            if trip.arrival >= SECONDS_PER_DAY:
                active.append(ActiveTrip(trip, -SECONDS_PER_DAY))
        return active

    def departures(self, stop_id: str, day: date, after: int | str = 0) -> list[tuple[int, Trip]]:
        """(departure time, trip) of every vehicle leaving `stop_id` on `day` at or after
        `after`, in time order; a trip's last stop is not a departure."""
        self.stop(stop_id)
        start = as_seconds(after)
        board: list[tuple[int, Trip]] = []
        for active in self.active_trips(day):
            for stop, _, departure in active.times()[:-1]:
                if stop == stop_id and departure >= start:
                    board.append((departure, active.trip))
        board.sort(key=lambda pair: (pair[0], pair[1].trip_id))
        return board


def _add_unique(table: dict, key: str, value: object, kind: str) -> None:
    if key in table:
        raise ValidationError(f"{kind} {key!r} already exists")
    table[key] = value


def make_trip(
    trip_id: str, route_id: str, service_id: str, calls: Iterable[tuple[str, str]], headsign: str = ""
) -> Trip:
    """A trip from (stop id, "HH:MM") pairs, arriving and departing at the same time."""
    stop_times = tuple(StopTime(stop_id, parse_time(t), parse_time(t)) for stop_id, t in calls)
    return Trip(trip_id, route_id, service_id, stop_times, headsign)
