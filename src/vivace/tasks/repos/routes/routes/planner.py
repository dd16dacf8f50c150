"""Journey planning: the earliest arrival from one stop to another.

The search is a round-based connection scan. Round k finds every stop that can be
reached with k rides, scanning the day's connections in departure order: a trip can be
boarded where round k-1 left the traveller ready in time, and once boarded it is ridden
on. After each ride the traveller may walk one footpath. Changing vehicles at a stop
takes at least `min_transfer` seconds; a footpath's walking time replaces that margin,
and the first vehicle can be boarded right away. At most `max_transfers + 1` rides are
taken, and of equally early journeys the one with fewer rides wins.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace

from .errors import NoRouteError, ValidationError
from .graph import Connection, Footpath, Network
from .stops import Stop
from .timetable import Route, as_seconds, format_time

#: Default minimum time to change vehicles at a stop, in seconds.
MIN_TRANSFER = 120
#: Default largest number of changes between vehicles.
MAX_TRANSFERS = 3


@dataclass(frozen=True)
class Leg(ABC):
    """A part of a journey from `origin` to `destination`, leaving at `departure` and
    arriving at `arrival` (seconds on the network day's clock)."""

    origin: Stop
    destination: Stop
    departure: int
    arrival: int

    @property
    def duration(self) -> int:
        return self.arrival - self.departure

    @abstractmethod
    def describe(self) -> str:
        """One line for a passenger."""


@dataclass(frozen=True)
class RideLeg(Leg):
    """A ride on one trip; `stops` are all its calls from `origin` to `destination`."""

    trip_id: str
    route: Route
    headsign: str
    stops: tuple[Stop, ...]

    @property
    def hops(self) -> int:
        """How many stops further the ride ends."""
        return len(self.stops) - 1

    @property
    def distance(self) -> float:
        """Length of the ride in metres, stop to stop in straight lines."""
        return sum(a.distance_to(b) for a, b in zip(self.stops, self.stops[1:]))

    def describe(self) -> str:
        towards = f" towards {self.headsign}" if self.headsign else ""
        plural = "" if self.hops == 1 else "s"
        return (
            f"{format_time(self.departure)} {self.route.mode} {self.route.name}{towards} from {self.origin.name}"
            f" to {self.destination.name} ({self.hops} stop{plural}), arrive {format_time(self.arrival)}"
        )


@dataclass(frozen=True)
class WalkLeg(Leg):
    """A walk of `distance` metres between two stops."""

    distance: float

    def describe(self) -> str:
        return (
            f"{format_time(self.departure)} walk {round(self.distance)} m from {self.origin.name}"
            f" to {self.destination.name}, arrive {format_time(self.arrival)}"
        )


@dataclass(frozen=True)
class Journey:
    """Legs that follow one another: each starts where and after the previous one ends."""

    legs: tuple[Leg, ...]

    def __post_init__(self) -> None:
        if not self.legs:
            raise ValidationError("a journey needs at least one leg")
        for before, after in zip(self.legs, self.legs[1:]):
            if after.origin != before.destination:
                raise ValidationError(f"leg from {after.origin.stop_id} does not start where the previous one ends")
            if after.departure < before.arrival:
                raise ValidationError(f"leg from {after.origin.stop_id} leaves before the previous one arrives")

    @property
    def origin(self) -> Stop:
        return self.legs[0].origin

    @property
    def destination(self) -> Stop:
        return self.legs[-1].destination

    @property
    def departure(self) -> int:
        return self.legs[0].departure

    @property
    def arrival(self) -> int:
        return self.legs[-1].arrival

    @property
    def duration(self) -> int:
        return self.arrival - self.departure

    @property
    def rides(self) -> tuple[RideLeg, ...]:
        return tuple(leg for leg in self.legs if isinstance(leg, RideLeg))

    @property
    def transfers(self) -> int:
        return max(0, len(self.rides) - 1)

    @property
    def walking_distance(self) -> float:
        return sum(leg.distance for leg in self.legs if isinstance(leg, WalkLeg))

    def describe(self) -> str:
        return "\n".join(leg.describe() for leg in self.legs)


@dataclass(frozen=True)
class _Label:
    """How a stop was reached: at `arrival`, able to board from `ready`, by riding
    `ride` (boarding and alighting connection) and/or walking `walk` after `parent`."""

    arrival: int
    ready: int
    parent: _Label | None = None
    ride: tuple[Connection, Connection] | None = None
    walk: Footpath | None = None


def _improve(label: _Label, stop_id: str, key: str, best: dict[str, _Label], new: dict[str, _Label]) -> None:
    """Records `label` in `new` if its `key` time beats the best one known for the stop."""
    current = new.get(stop_id, best.get(stop_id))
    if current is None or getattr(label, key) < getattr(current, key):
        new[stop_id] = label


class Planner:
    """Earliest-arrival journeys in one day's network."""

    def __init__(self, network: Network, *, min_transfer: int = MIN_TRANSFER, max_transfers: int = MAX_TRANSFERS):
        if min_transfer < 0:
            raise ValidationError(f"minimum transfer time must not be negative, got {min_transfer}")
        if max_transfers < 0:
            raise ValidationError(f"maximum number of transfers must not be negative, got {max_transfers}")
        self.network = network
        self.min_transfer = min_transfer
        self.max_transfers = max_transfers

    def plan(self, origin: str, destination: str, depart_at: int | str) -> Journey:
        """The journey leaving `origin` at or after `depart_at` that arrives at
        `destination` first; raises `NoRouteError` when there is none."""
        self.network.stop(destination)
        if origin == destination:
            raise ValidationError(f"origin and destination are the same stop {origin!r}")
        label = self._scan(origin, as_seconds(depart_at)).get(destination)
        if label is None:
            raise NoRouteError(origin, destination)
        return self._journey(label)

    def earliest_arrivals(self, origin: str, depart_at: int | str) -> dict[str, int]:
        """Earliest arrival time at every stop reachable from `origin` (itself included)."""
        return {stop_id: label.arrival for stop_id, label in self._scan(origin, as_seconds(depart_at)).items()}

    def _scan(self, origin: str, start: int) -> dict[str, _Label]:
        """The best label of every reachable stop, leaving `origin` at `start`."""
        network = self.network
        here = _Label(start, start)
        arrived, ready = {origin: here}, {origin: here}
        for path in network.footpaths_from(origin):
            walked = _Label(start + path.duration, start + path.duration, here, walk=path)
            arrived[path.to_stop] = ready[path.to_stop] = walked
        connections = network.connections[network.first_connection(start) :]
        for _ in range(self.max_transfers + 1):
            new_arrived: dict[str, _Label] = {}
            new_ready: dict[str, _Label] = {}
            boarded: dict[str, tuple[Connection, _Label]] = {}
            for conn in connections:
                if conn.run_id not in boarded:
                    before = ready.get(conn.from_stop)
                    if before is None or before.ready > conn.departure:
                        continue
                    boarded[conn.run_id] = (conn, before)
                first, parent = boarded[conn.run_id]
                ride = (first, conn)
                label = _Label(conn.arrival, conn.arrival + self.min_transfer, parent, ride)
                _improve(label, conn.to_stop, "arrival", arrived, new_arrived)
                _improve(label, conn.to_stop, "ready", ready, new_ready)
                for path in network.footpaths_from(conn.to_stop):
                    end = conn.arrival + path.duration
                    walked = _Label(end, end, parent, ride, path)
                    _improve(walked, path.to_stop, "arrival", arrived, new_arrived)
                    _improve(walked, path.to_stop, "ready", ready, new_ready)
            if not new_ready and not new_arrived:
                break
            arrived.update(new_arrived)
            ready.update(new_ready)
        return arrived

    def _journey(self, label: _Label) -> Journey:
        legs: list[Leg] = []
        while label.parent is not None:
            if label.walk is not None:
                legs.append(self._walk_leg(label.walk, label.arrival))
            if label.ride is not None:
                legs.append(self._ride_leg(*label.ride))
            label = label.parent
        legs.reverse()
        if len(legs) > 1 and isinstance(legs[0], WalkLeg):
            # Leave as late as the first vehicle allows rather than waiting at its stop.
            leave = legs[1].departure - legs[0].duration
            legs[0] = replace(legs[0], departure=leave, arrival=legs[1].departure)
        return Journey(tuple(legs))

    def _walk_leg(self, path: Footpath, arrival: int) -> WalkLeg:
        network = self.network
        return WalkLeg(
            network.stop(path.from_stop), network.stop(path.to_stop), arrival - path.duration, arrival, path.distance
        )

    def _ride_leg(self, first: Connection, last: Connection) -> RideLeg:
        trip = self.network.runs[first.run_id].trip
        stops = self.network.run_stops(first.run_id, first.index, last.index)
        route = self.network.routes[trip.route_id]
        return RideLeg(stops[0], stops[-1], first.departure, last.arrival, trip.trip_id, route, trip.headsign, stops)
