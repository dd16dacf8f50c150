"""The error types of the routes package: every failure it raises is a `RoutesError`."""

from __future__ import annotations


class RoutesError(Exception):
    """Base class of all routes errors."""


class ValidationError(RoutesError, ValueError):
    """A value is malformed or out of range."""


class TimeFormatError(ValidationError):
    """A time of day is not written `HH:MM` or `HH:MM:SS`."""


class UnknownStopError(RoutesError, KeyError):
    """A stop id is not part of the timetable or network."""

    def __init__(self, stop_id: str) -> None:
        super().__init__(stop_id)
        self.stop_id = stop_id

    def __str__(self) -> str:
        return f"unknown stop {self.stop_id!r}"


class NoRouteError(RoutesError):
    """No journey connects the two stops within the planner's limits."""

    def __init__(self, origin: str, destination: str) -> None:
        super().__init__(f"no route from {origin!r} to {destination!r}")
        self.origin = origin
        self.destination = destination


class FareError(RoutesError):
    """A fare rule is unknown, badly configured or cannot price a journey."""


class FeedError(RoutesError):
    """A feed file is malformed; `file` names it and `line` is the 1-based line number
    (0 when the problem is not tied to one line, such as a missing file)."""

    def __init__(self, message: str, file: str, line: int = 0) -> None:
        where = f"{file}, line {line}" if line else file
        super().__init__(f"{where}: {message}")
        self.file = file
        self.line = line
