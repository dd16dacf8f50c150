"""Calendar scheduling: events, recurrence rules, conflicts, free time and a text format."""

from .errors import ConflictError, ParseError, RecurrenceError, SchedulerError, ValidationError
from .events import Event, Occurrence
from .ics import dumps, loads
from .planner import Calendar
from .recurrence import Frequency, RecurrenceRule, frequency_names, get_frequency, register_frequency
from .timeutil import Interval, merge_intervals, subtract

__all__ = [
    "Calendar",
    "ConflictError",
    "Event",
    "Frequency",
    "Interval",
    "Occurrence",
    "ParseError",
    "RecurrenceError",
    "RecurrenceRule",
    "SchedulerError",
    "ValidationError",
    "dumps",
    "frequency_names",
    "get_frequency",
    "loads",
    "merge_intervals",
    "register_frequency",
    "subtract",
]
