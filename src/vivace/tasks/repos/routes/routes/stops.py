"""Stops and the geography between them: great-circle distances and walking times."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from .errors import ValidationError

EARTH_RADIUS_M = 6_371_000.0
#: Default walking speed in metres per second (about 4.5 km/h).
WALK_SPEED = 1.25


def haversine(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance in metres between two points given in degrees."""
    phi1, phi2 = math.radians(lat1), math.radians(lat2)
    d_phi = phi2 - phi1
    d_lambda = math.radians(lon2 - lon1)
    h = math.sin(d_phi / 2) ** 2 + math.cos(phi1) * math.cos(phi2) * math.sin(d_lambda / 2) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(h)))


def walking_seconds(distance: float, speed: float = WALK_SPEED) -> int:
    """Whole seconds needed to walk `distance` metres at `speed` m/s, rounded up."""
    if speed <= 0:
        raise ValidationError(f"walking speed must be positive, got {speed}")
    if distance < 0:
        raise ValidationError(f"distance must not be negative, got {distance}")
    return math.ceil(distance / speed)


@dataclass(frozen=True)
class Stop:
    """A place where vehicles stop. `zone` is the fare zone ("" when the stop has none)."""

    stop_id: str
    name: str
    lat: float
    lon: float
    zone: str = ""

    def __post_init__(self) -> None:
        if not self.stop_id or self.stop_id != self.stop_id.strip():
            raise ValidationError(f"invalid stop id {self.stop_id!r}")
        if not -90.0 <= self.lat <= 90.0:
            raise ValidationError(f"latitude of {self.stop_id} must be within -90..90, got {self.lat}")
        if not -180.0 <= self.lon <= 180.0:
            raise ValidationError(f"longitude of {self.stop_id} must be within -180..180, got {self.lon}")

    def distance_to(self, other: Stop) -> float:
        """Great-circle distance to `other` in metres."""
        return haversine(self.lat, self.lon, other.lat, other.lon)


def stops_within(stops: Iterable[Stop], centre: Stop, radius: float) -> list[tuple[Stop, float]]:
    """The stops other than `centre` at most `radius` metres away, with their distances,
    nearest first (ties by stop id)."""
    if radius < 0:
        raise ValidationError(f"radius must not be negative, got {radius}")
    found = []
    for stop in stops:
        if stop.stop_id == centre.stop_id:
            continue
        distance = centre.distance_to(stop)
        if distance <= radius:
            found.append((stop, distance))
    found.sort(key=lambda pair: (pair[1], pair[0].stop_id))
    return found
