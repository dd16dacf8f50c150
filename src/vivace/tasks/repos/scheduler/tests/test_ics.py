from datetime import datetime, timedelta

import pytest

from scheduler.errors import ParseError
from scheduler.events import Event
from scheduler.ics import (
    MAX_LINE_LENGTH,
    dumps,
    escape_text,
    fold,
    format_rrule,
    loads,
    parse_rrule,
    unescape_text,
    unfold,
)
from scheduler.planner import Calendar
from scheduler.recurrence import RecurrenceRule

START = datetime(2024, 1, 8, 9, 30)


def calendar_text(*event_lines: str) -> str:
    return "\r\n".join(["BEGIN:VCALENDAR", "VERSION:2.0", *event_lines, "END:VCALENDAR"]) + "\r\n"


VEVENT = ["BEGIN:VEVENT", "UID:a", "SUMMARY:A", "DTSTART:20240108T093000", "DTEND:20240108T100000", "END:VEVENT"]


def test_escape_and_unescape():
    text = "Plan; review, and\\or\nlunch"
    escaped = escape_text(text)
    assert escaped == "Plan\\; review\\, and\\\\or\\nlunch"
    assert unescape_text(escaped) == text
    assert unescape_text("a\\Nb") == "a\nb"
    with pytest.raises(ParseError, match="line 4: dangling backslash"):
        unescape_text("abc\\", 4)


def test_fold_and_unfold():
    assert fold("short") == ["short"]
    exact = "x" * MAX_LINE_LENGTH
    assert fold(exact) == [exact]
    long = "SUMMARY:" + "y" * 200
    parts = fold(long)
    assert len(parts[0]) == MAX_LINE_LENGTH
    assert all(len(p) <= MAX_LINE_LENGTH for p in parts)
    assert all(p.startswith(" ") for p in parts[1:])
    assert "".join([parts[0], *(p[1:] for p in parts[1:])]) == long
    assert len(fold("z" * (MAX_LINE_LENGTH + MAX_LINE_LENGTH - 1))) == 2
    assert len(fold("z" * (MAX_LINE_LENGTH + MAX_LINE_LENGTH))) == 3
    assert unfold("A:1\r\n B\r\n\tC\r\n\r\nD:2\n") == [(1, "A:1BC"), (5, "D:2")]
    with pytest.raises(ParseError, match="line 1"):
        unfold(" leading")


def test_rrule_text():
    rule = RecurrenceRule("WEEKLY", interval=2, count=10, byday=(0, 2))
    assert format_rrule(rule) == "FREQ=WEEKLY;INTERVAL=2;COUNT=10;BYDAY=MO,WE"
    assert parse_rrule(format_rrule(rule)) == rule
    until = RecurrenceRule("DAILY", until=datetime(2024, 2, 1, 9))
    assert format_rrule(until) == "FREQ=DAILY;UNTIL=20240201T090000"
    assert parse_rrule("freq=monthly;interval=3") == RecurrenceRule("MONTHLY", interval=3)


def test_bad_rrules():
    bad = [
        "INTERVAL=2",
        "FREQ=WEEKLY;COUNT",
        "FREQ=WEEKLY;COUNT=-1",
        "FREQ=WEEKLY;COUNT=x",
        "FREQ=SECONDLY",
        "FREQ=DAILY;BYDAY=MO",
        "FREQ=WEEKLY;BYDAY=XX",
        "FREQ=DAILY;COUNT=2;UNTIL=20240101T000000",
        "FREQ=DAILY;INTERVAL=0",
    ]
    for text in bad:
        with pytest.raises(ParseError, match="line 7"):
            parse_rrule(text, 7)


def test_bad_rrule_messages():
    with pytest.raises(ParseError, match="COUNT must be a whole number, got 'x'"):
        parse_rrule("FREQ=DAILY;COUNT=x")
    with pytest.raises(ParseError, match="malformed RRULE part 'COUNT='"):
        parse_rrule("FREQ=DAILY;COUNT=")


def test_dumps():
    cal = Calendar("Team, EU")
    rule = RecurrenceRule("WEEKLY", count=3, byday=(0,))
    cal.add(Event("standup", "Stand-up; daily", START, START + timedelta(minutes=15), rule, "Room 1",
                  exdates={START + timedelta(weeks=1)}))  # fmt: skip
    cal.add(Event("solo", "Focus", START + timedelta(hours=2), START + timedelta(hours=3)))
    text = dumps(cal)
    assert text.endswith("END:VCALENDAR\r\n")
    assert text.split("\r\n")[:10] == [
        "BEGIN:VCALENDAR",
        "VERSION:2.0",
        "PRODID:-//vivace//scheduler//EN",
        "X-WR-CALNAME:Team\\, EU",
        "BEGIN:VEVENT",
        "UID:standup",
        "SUMMARY:Stand-up\\; daily",
        "DTSTART:20240108T093000",
        "DTEND:20240108T094500",
        "LOCATION:Room 1",
    ]
    assert "RRULE:FREQ=WEEKLY;COUNT=3;BYDAY=MO\r\nEXDATE:20240115T093000\r\nEND:VEVENT" in text
    assert "UID:solo\r\nSUMMARY:Focus\r\nDTSTART:20240108T113000\r\nDTEND:20240108T123000\r\nEND:VEVENT" in text


def test_round_trip():
    cal = Calendar("Mine")
    long_title = "Quarterly planning, budget; and " + "very " * 30 + "long\nagenda"
    cal.add(Event("q", long_title, START, START + timedelta(hours=2), RecurrenceRule("MONTHLY", interval=3, count=4),
                  exdates={START, START + timedelta(days=182)}))  # fmt: skip
    cal.add(
        Event(
            "d", "Daily", START, START + timedelta(minutes=5), RecurrenceRule("DAILY", until=START + timedelta(days=3))
        )
    )
    text = dumps(cal)
    assert max(len(line) for line in text.split("\r\n")) <= MAX_LINE_LENGTH
    again = loads(text)
    assert again.name == "Mine"
    assert [e.uid for e in again] == ["q", "d"]
    for original in cal:
        parsed = again.get(original.uid)
        assert (parsed.title, parsed.start, parsed.end, parsed.rule, parsed.exdates, parsed.location) == (
            original.title, original.start, original.end, original.rule, original.exdates, original.location,
        )  # fmt: skip


def test_loads_minimal_and_ignores_unknown_properties():
    text = calendar_text("PRODID:other", "X-CUSTOM:1", "BEGIN:VEVENT", "UID:a", "SUMMARY;LANGUAGE=en:A",
                         "DTSTART:20240108T093000", "DTEND:20240108T100000", "X-COLOR:red", "END:VEVENT")  # fmt: skip
    cal = loads(text)
    (event,) = list(cal)
    assert (event.uid, event.title, event.rule, event.location, event.exdates) == ("a", "A", None, "", frozenset())
    assert cal.name == ""
    assert len(loads("BEGIN:VCALENDAR\nEND:VCALENDAR\n")) == 0


LOAD_ERRORS = [
    (["BEGIN:VEVENT", "BEGIN:VEVENT"], 4, "nested"),
    (["END:VEVENT"], 3, "without BEGIN"),
    (["BEGIN:VEVENT", "UID:a", "END:VEVENT"], 3, "without SUMMARY, DTSTART, DTEND"),
    (["BEGIN:VEVENT", "UID:a", "UID:b"], 5, "UID given twice"),
    (["BEGIN:VEVENT", "garbage"], 4, "expected NAME:VALUE"),
    (["BEGIN:VEVENT", "UID:a", "SUMMARY:A", "DTSTART:2024", "DTEND:20240108T100000", "END:VEVENT"], 3, "datetime"),
    (["BEGIN:VEVENT", "UID:a", "SUMMARY:A", "DTSTART:20240108T100000", "DTEND:20240108T090000", "END:VEVENT"], 3, "ends before"),
    (["BEGIN:VEVENT", "UID:a", "SUMMARY:A", "DTSTART:20240108T100000", "DTEND:20240108T110000", "RRULE:FREQ=NEVER", "END:VEVENT"], 8, "unknown frequency"),
    ([*VEVENT, *VEVENT], 9, "duplicate UID"),
    (["BEGIN:VEVENT", "UID:a"], 5, "inside an event"),
]  # fmt: skip


def test_loads_errors():
    for lines, line, message in LOAD_ERRORS:
        with pytest.raises(ParseError) as info:
            loads(calendar_text(*lines))
        assert (info.value.line, message in str(info.value)) == (line, True), message


def test_loads_envelope_errors():
    with pytest.raises(ParseError, match="line 1: expected BEGIN:VCALENDAR"):
        loads("BEGIN:VEVENT\n")
    with pytest.raises(ParseError, match="line 1: expected BEGIN:VCALENDAR"):
        loads("")
    with pytest.raises(ParseError, match="line 2: missing END:VCALENDAR"):
        loads("BEGIN:VCALENDAR\nVERSION:2.0\n")
    with pytest.raises(ParseError, match="line 3: text after END:VCALENDAR"):
        loads("BEGIN:VCALENDAR\nEND:VCALENDAR\nX:1\n")
