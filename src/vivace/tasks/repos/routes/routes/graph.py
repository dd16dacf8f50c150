"""The network of one service day: elementary connections and walking footpaths.

A `Connection` is a vehicle going from one stop to the next without stopping in
between; the connections of a day are kept sorted by departure, which is the order the
connection scan in `planner` relies on. A `Footpath` is a walk between two different
stops: every pair of stops at most `walk_radius` metres apart gets one (at `walk_speed`),
and the timetable's explicit transfers replace or add to those.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from datetime import date

from .errors import UnknownStopError, ValidationError
from .stops import WALK_SPEED, Stop, stops_within, walking_seconds
from .timetable import ActiveTrip, Route, Timetable

#: Default longest walk between two stops, in metres.
WALK_RADIUS = 400.0


@dataclass(frozen=True, order=True)
class Connection:
    """A hop from `from_stop` to `to_stop` of the trip run `run_id` (see
    `ActiveTrip.run_id`); `index` is the hop's position in the trip."""

    departure: int
    arrival: int
    run_id: str
    index: int
    from_stop: str
    to_stop: str

    @property
    def duration(self) -> int:
        return self.arrival - self.departure


@dataclass(frozen=True)
class Footpath:
    """A walk of `duration` seconds over `distance` metres (straight-line estimate)."""

    from_stop: str
    to_stop: str
    duration: int
    distance: float


class Network:
    """What runs on one day, ready for searching."""

    def __init__(
        self,
        day: date,
        stops: dict[str, Stop],
        routes: dict[str, Route],
        runs: dict[str, ActiveTrip],
        connections: list[Connection],
        footpaths: list[Footpath],
    ) -> None:
        self.day = day
        self.stops = dict(stops)
        self.routes = dict(routes)
        self.runs = dict(runs)
        self.connections = sorted(connections)
        self._departures = [c.departure for c in self.connections]
        self._footpaths: dict[str, list[Footpath]] = {stop_id: [] for stop_id in self.stops}
        for path in footpaths:
            self.stop(path.from_stop)
            self.stop(path.to_stop)
            self._footpaths[path.from_stop].append(path)
        for paths in self._footpaths.values():
            paths.sort(key=lambda p: (p.duration, p.to_stop))

    @classmethod
    def build(
        cls, timetable: Timetable, day: date, *, walk_radius: float = WALK_RADIUS, walk_speed: float = WALK_SPEED
    ) -> Network:
        """The network of `day`: connections of the trips running then (including last
        night's trips after midnight) and footpaths between stops."""
        if walk_radius < 0:
            raise ValidationError(f"walk radius must not be negative, got {walk_radius}")
        connections: list[Connection] = []
        runs: dict[str, ActiveTrip] = {}
        for active in timetable.active_trips(day):
            times = active.times()
            runs[active.run_id] = active
            for index, (here, there) in enumerate(zip(times, times[1:])):
                if here[2] >= 0:
                    connections.append(Connection(here[2], there[1], active.run_id, index, here[0], there[0]))
        footpaths = _footpaths(timetable, walk_radius, walk_speed)
        return cls(day, timetable.stops, timetable.routes, runs, connections, footpaths)

    def stop(self, stop_id: str) -> Stop:
        try:
            return self.stops[stop_id]
        except KeyError:
            raise UnknownStopError(stop_id) from None

    def footpaths_from(self, stop_id: str) -> list[Footpath]:
        """Walks starting at `stop_id`, shortest first."""
        self.stop(stop_id)
        return list(self._footpaths[stop_id])

    def first_connection(self, time: int) -> int:
        """Index of the first connection departing at or after `time`."""
        return bisect_left(self._departures, time)

    def connections_between(self, start: int, end: int) -> list[Connection]:
        """Connections departing from `start` (included) to `end` (excluded)."""
        return self.connections[self.first_connection(start) : self.first_connection(end)]

    def run_stops(self, run_id: str, first: int, last: int) -> tuple[Stop, ...]:
        """The stops a trip run calls at from hop `first` to hop `last` (both included)."""
        stop_ids = self.runs[run_id].trip.stop_ids[first : last + 2]
        return tuple(self.stops[s] for s in stop_ids)


def _footpaths(timetable: Timetable, walk_radius: float, walk_speed: float) -> list[Footpath]:
    paths: dict[tuple[str, str], Footpath] = {}
    stops = list(timetable.stops.values())
    for stop in stops:
        for other, distance in stops_within(stops, stop, walk_radius):
            key = (stop.stop_id, other.stop_id)
            paths[key] = Footpath(*key, walking_seconds(distance, walk_speed), distance)
    for (from_stop, to_stop), seconds in timetable.transfers.items():
        distance = timetable.stop(from_stop).distance_to(timetable.stop(to_stop))
        paths[(from_stop, to_stop)] = Footpath(from_stop, to_stop, seconds, distance)
    return sorted(paths.values(), key=lambda p: (p.from_stop, p.to_stop))
