"""Error types of the scheduler package."""

from __future__ import annotations


class SchedulerError(Exception):
    """Base class of all scheduler errors."""


class ValidationError(SchedulerError, ValueError):
    """A value is malformed or out of range."""


class RecurrenceError(ValidationError):
    """A recurrence rule is invalid."""


class ConflictError(SchedulerError):
    """An event overlaps events already in the calendar."""


class ParseError(SchedulerError):
    """Calendar text is malformed; `line` is the 1-based line number (0 if unknown)."""

    def __init__(self, message: str, line: int = 0) -> None:
        super().__init__(f"line {line}: {message}" if line else message)
        self.line = line
