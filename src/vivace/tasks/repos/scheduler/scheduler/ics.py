"""A small iCalendar-like text format for calendars.

    BEGIN:VCALENDAR
    VERSION:2.0
    PRODID:-//vivace//scheduler//EN
    X-WR-CALNAME:Team
    BEGIN:VEVENT
    UID:standup
    SUMMARY:Stand-up\\, daily
    DTSTART:20240108T093000
    DTEND:20240108T094500
    RRULE:FREQ=WEEKLY;COUNT=10;BYDAY=MO,WE,FR
    EXDATE:20240110T093000
    END:VEVENT
    END:VCALENDAR

Lines are `NAME:VALUE` (parameters after `;` in the name are ignored), joined with CRLF
and folded at 75 characters (continuation lines start with a space). Text values escape
backslash, comma, semicolon and newline. Unknown properties are ignored when reading.
"""

from __future__ import annotations

from .errors import ParseError, SchedulerError
from .events import Event
from .planner import Calendar
from .recurrence import RecurrenceRule
from .timeutil import WEEKDAY_CODES, format_datetime, parse_datetime, parse_weekday

PRODID = "-//vivace//scheduler//EN"
MAX_LINE_LENGTH = 75
REQUIRED_PROPERTIES = ("UID", "SUMMARY", "DTSTART", "DTEND")

_ESCAPES = {"\\": "\\\\", ";": "\\;", ",": "\\,", "\n": "\\n"}


def escape_text(text: str) -> str:
    return "".join(_ESCAPES.get(char, char) for char in text)


def unescape_text(text: str, line: int = 0) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            if i + 1 == len(text):
                raise ParseError("dangling backslash", line)
            following = text[i + 1]
            out.append("\n" if following in "nN" else following)
            i += 2
        else:
            out.append(char)
            i += 1
    return "".join(out)


def fold(line: str) -> list[str]:
    """Splits a long line: the first part has `MAX_LINE_LENGTH` characters, the others a
    leading space and `MAX_LINE_LENGTH - 1` characters."""
    parts = [line[:MAX_LINE_LENGTH]]
    rest = line[MAX_LINE_LENGTH:]
    while rest:
        parts.append(" " + rest[: MAX_LINE_LENGTH - 1])
        rest = rest[MAX_LINE_LENGTH - 1 :]
    return parts


def unfold(text: str) -> list[tuple[int, str]]:
    """Logical lines with the number of the physical line they start on; blank lines dropped."""
    lines: list[tuple[int, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if raw[:1] in (" ", "\t"):
            if not lines:
                raise ParseError("continuation line without a line to continue", number)
            start, previous = lines[-1]
            lines[-1] = (start, previous + raw[1:])
        elif raw.strip():
            lines.append((number, raw))
    return lines


def format_rrule(rule: RecurrenceRule) -> str:
    parts = [f"FREQ={rule.freq}"]
    if rule.interval != 1:
        parts.append(f"INTERVAL={rule.interval}")
    if rule.count is not None:
        parts.append(f"COUNT={rule.count}")
    if rule.until is not None:
        parts.append(f"UNTIL={format_datetime(rule.until)}")
    if rule.byday:
        parts.append("BYDAY=" + ",".join(WEEKDAY_CODES[d] for d in rule.byday))
    return ";".join(parts)


def _positive_int(value: str, name: str, line: int) -> int:
    if not value.isdigit():
        raise ParseError(f"{name} must be a whole number, got {value!r}", line)
    return int(value)


def parse_rrule(value: str, line: int = 0) -> RecurrenceRule:
    fields: dict[str, str] = {}
    for part in value.split(";"):
        key, sep, val = part.partition("=")
        if not sep or not val:
            raise ParseError(f"malformed RRULE part {part!r}", line)
        fields[key.strip().upper()] = val.strip()
    if "FREQ" not in fields:
        raise ParseError("RRULE needs FREQ", line)
    try:
        return RecurrenceRule(
            freq=fields["FREQ"],
            interval=_positive_int(fields.get("INTERVAL", "1"), "INTERVAL", line),
            count=_positive_int(fields["COUNT"], "COUNT", line) if "COUNT" in fields else None,
            until=parse_datetime(fields["UNTIL"]) if "UNTIL" in fields else None,
            byday=tuple(parse_weekday(d) for d in fields["BYDAY"].split(",")) if "BYDAY" in fields else (),
        )
    except SchedulerError as e:
        if isinstance(e, ParseError):
            raise
        raise ParseError(str(e), line) from None


def _event_lines(event: Event) -> list[str]:
    lines = [
        "BEGIN:VEVENT",
        f"UID:{event.uid}",
        f"SUMMARY:{escape_text(event.title)}",
        f"DTSTART:{format_datetime(event.start)}",
        f"DTEND:{format_datetime(event.end)}",
    ]
    if event.location:
        lines.append(f"LOCATION:{escape_text(event.location)}")
    if event.rule is not None:
        lines.append(f"RRULE:{format_rrule(event.rule)}")
    if event.exdates:
        lines.append("EXDATE:" + ",".join(format_datetime(d) for d in sorted(event.exdates)))
    lines.append("END:VEVENT")
    return lines


def dumps(calendar: Calendar) -> str:
    """The calendar as text (CRLF line ends, long lines folded)."""
    lines = ["BEGIN:VCALENDAR", "VERSION:2.0", f"PRODID:{PRODID}"]
    if calendar.name:
        lines.append(f"X-WR-CALNAME:{escape_text(calendar.name)}")
    for event in calendar:
        lines.extend(_event_lines(event))
    lines.append("END:VCALENDAR")
    return "".join(part + "\r\n" for line in lines for part in fold(line))


def _build_event(props: dict[str, tuple[int, str]], line: int) -> Event:
    missing = [name for name in REQUIRED_PROPERTIES if name not in props]
    if missing:
        raise ParseError(f"event without {', '.join(missing)}", line)

    def value(name: str) -> str:
        return props[name][1]

    def at(name: str) -> int:
        return props[name][0]

    try:
        rule = parse_rrule(value("RRULE"), at("RRULE")) if "RRULE" in props else None
        exdates = frozenset(parse_datetime(d) for d in value("EXDATE").split(",")) if "EXDATE" in props else frozenset()
        return Event(
            uid=value("UID"),
            title=unescape_text(value("SUMMARY"), at("SUMMARY")),
            start=parse_datetime(value("DTSTART")),
            end=parse_datetime(value("DTEND")),
            rule=rule,
            location=unescape_text(value("LOCATION"), at("LOCATION")) if "LOCATION" in props else "",
            exdates=exdates,
        )
    except ParseError:
        raise
    except SchedulerError as e:
        raise ParseError(str(e), line) from None


def loads(text: str) -> Calendar:
    """Parses calendar text; raises `ParseError` naming the line of the first problem."""
    lines = unfold(text)
    if not lines or lines[0][1].strip().upper() != "BEGIN:VCALENDAR":
        raise ParseError("expected BEGIN:VCALENDAR", lines[0][0] if lines else 1)
    calendar = Calendar()
    event_props: dict[str, tuple[int, str]] | None = None
    event_line = 0
    ended = False
    for number, raw in lines[1:]:
        if ended:
            raise ParseError("text after END:VCALENDAR", number)
        name_part, sep, value = raw.partition(":")
        if not sep:
            raise ParseError(f"expected NAME:VALUE, got {raw!r}", number)
        name = name_part.split(";")[0].strip().upper()
        if name == "BEGIN" and value.strip().upper() == "VEVENT":
            if event_props is not None:
                raise ParseError("nested BEGIN:VEVENT", number)
            event_props, event_line = {}, number
        elif name == "END" and value.strip().upper() == "VEVENT":
            if event_props is None:
                raise ParseError("END:VEVENT without BEGIN:VEVENT", number)
            event = _build_event(event_props, event_line)
            if event.uid in calendar:
                raise ParseError(f"duplicate UID {event.uid!r}", event_line)
            calendar.add(event)
            event_props = None
        elif name == "END" and value.strip().upper() == "VCALENDAR":
            if event_props is not None:
                raise ParseError("END:VCALENDAR inside an event", number)
            ended = True
        elif event_props is not None:
            if name in event_props:
                raise ParseError(f"{name} given twice", number)
            event_props[name] = (number, value)
        elif name == "X-WR-CALNAME":
            calendar.name = unescape_text(value, number)
    if not ended:
        raise ParseError("missing END:VCALENDAR", lines[-1][0])
    return calendar
