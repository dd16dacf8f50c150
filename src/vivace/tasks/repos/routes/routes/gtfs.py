"""Reading timetables from a small GTFS-like feed: one CSV file per table.

Required files and columns (others are ignored):

- stops.txt: stop_id, stop_name, stop_lat, stop_lon (optional zone_id)
- routes.txt: route_id, route_short_name (optional route_type: 0 tram, 1 subway,
  2 rail, 3 bus, 4 ferry; bus when empty)
- calendar.txt: service_id, monday ... sunday (0 or 1), start_date, end_date (YYYYMMDD)
- trips.txt: route_id, service_id, trip_id (optional trip_headsign)
- stop_times.txt: trip_id, arrival_time, departure_time, stop_id, stop_sequence

Optional files: calendar_dates.txt (service_id, date, exception_type: 1 adds the date,
2 removes it) and transfers.txt (from_stop_id, to_stop_id, min_transfer_time in seconds).
Problems raise `FeedError` naming the file and the line.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Mapping
from datetime import date
from pathlib import Path

from .errors import FeedError, RoutesError
from .stops import Stop
from .timetable import Route, Service, StopTime, Timetable, Trip, parse_time

REQUIRED_FILES = ("stops.txt", "routes.txt", "calendar.txt", "trips.txt", "stop_times.txt")
OPTIONAL_FILES = ("calendar_dates.txt", "transfers.txt")
ROUTE_TYPES = {"0": "tram", "1": "subway", "2": "rail", "3": "bus", "4": "ferry"}
WEEKDAY_COLUMNS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")


class _Table:
    """The rows of one CSV file, each with its line number, checked for `columns`."""

    def __init__(self, name: str, text: str, columns: tuple[str, ...]) -> None:
        self.name = name
        self._reader = csv.DictReader(io.StringIO(text.lstrip("\ufeff")), skipinitialspace=True)
        header = [column.strip() for column in self._reader.fieldnames or ()]
        if not header:
            raise FeedError("file is empty", name)
        self._reader.fieldnames = header
        for column in columns:
            if column not in header:
                raise FeedError(f"missing column {column!r}", name, 1)

    def __iter__(self) -> Iterator[tuple[int, dict[str, str]]]:
        for row in self._reader:
            values = {key: (value or "").strip() for key, value in row.items() if key is not None}
            if any(values.values()):
                yield self._reader.line_num, values

    def error(self, message: str, line: int) -> FeedError:
        return FeedError(message, self.name, line)

    def required(self, row: dict[str, str], column: str, line: int) -> str:
        value = row.get(column, "")
        if not value:
            raise self.error(f"empty {column}", line)
        return value


def parse_date(text: str) -> date:
    """A date written YYYYMMDD."""
    if len(text) != 8 or not text.isdigit():
        raise ValueError(f"invalid date {text!r}: expected YYYYMMDD")
    try:
        return date(int(text[:4]), int(text[4:6]), int(text[6:]))
    except ValueError:
        raise ValueError(f"invalid date {text!r}") from None


def load_directory(path: str | Path) -> Timetable:
    """Loads the feed files from a directory."""
    folder = Path(path)
    files: dict[str, str] = {}
    for name in REQUIRED_FILES + OPTIONAL_FILES:
        file = folder / name
        if file.is_file():
            files[name] = file.read_text(encoding="utf-8-sig")
    return load_feed(files)


def load_feed(files: Mapping[str, str]) -> Timetable:
    """Loads a feed given as file name -> CSV text."""
    for name in REQUIRED_FILES:
        if name not in files:
            raise FeedError("missing file", name)
    timetable = Timetable()
    _load_stops(timetable, files["stops.txt"])
    _load_routes(timetable, files["routes.txt"])
    _load_services(timetable, files["calendar.txt"], files.get("calendar_dates.txt"))
    _load_trips(timetable, files["trips.txt"], files["stop_times.txt"])
    if "transfers.txt" in files:
        _load_transfers(timetable, files["transfers.txt"])
    return timetable


def _load_stops(timetable: Timetable, text: str) -> None:
    table = _Table("stops.txt", text, ("stop_id", "stop_name", "stop_lat", "stop_lon"))
    for line, row in table:
        try:
            lat, lon = float(row["stop_lat"]), float(row["stop_lon"])
            timetable.add_stop(Stop(row["stop_id"], row["stop_name"], lat, lon, row.get("zone_id", "")))
        except (RoutesError, ValueError) as exc:
            raise table.error(str(exc), line) from None


def _load_routes(timetable: Timetable, text: str) -> None:
    table = _Table("routes.txt", text, ("route_id", "route_short_name"))
    for line, row in table:
        route_type = row.get("route_type", "") or "3"
        if route_type not in ROUTE_TYPES:
            raise table.error(f"unknown route_type {route_type!r}", line)
        route_id = table.required(row, "route_id", line)
        try:
            timetable.add_route(Route(route_id, row["route_short_name"], ROUTE_TYPES[route_type]))
        except RoutesError as exc:
            raise table.error(str(exc), line) from None


def _load_services(timetable: Timetable, calendar: str, calendar_dates: str | None) -> None:
    table = _Table("calendar.txt", calendar, ("service_id", *WEEKDAY_COLUMNS, "start_date", "end_date"))
    rows: dict[str, tuple[int, dict[str, str]]] = {}
    for line, row in table:
        service_id = table.required(row, "service_id", line)
        if service_id in rows:
            raise table.error(f"service {service_id!r} already exists", line)
        rows[service_id] = (line, row)
    exceptions: dict[str, tuple[set[date], set[date]]] = {service_id: (set(), set()) for service_id in rows}
    if calendar_dates is not None:
        dates = _Table("calendar_dates.txt", calendar_dates, ("service_id", "date", "exception_type"))
        for line, row in dates:
            if row["service_id"] not in exceptions:
                raise dates.error(f"unknown service {row['service_id']!r}", line)
            kind = row["exception_type"]
            if kind not in ("1", "2"):
                raise dates.error(f"exception_type must be 1 or 2, got {kind!r}", line)
            try:
                day = parse_date(row["date"])
            except ValueError as exc:
                raise dates.error(str(exc), line) from None
            exceptions[row["service_id"]][0 if kind == "1" else 1].add(day)
    for service_id, (line, row) in rows.items():
        flags = [row[column] for column in WEEKDAY_COLUMNS]
        if any(flag not in ("0", "1") for flag in flags):
            raise table.error("weekday columns must be 0 or 1", line)
        added, removed = exceptions[service_id]
        try:
            weekdays = frozenset(i for i, flag in enumerate(flags) if flag == "1")
            start, end = parse_date(row["start_date"]), parse_date(row["end_date"])
            timetable.add_service(Service(service_id, weekdays, start, end, frozenset(added), frozenset(removed)))
        except (RoutesError, ValueError) as exc:
            raise table.error(str(exc), line) from None


def _load_trips(timetable: Timetable, trips_text: str, stop_times_text: str) -> None:
    trips = _Table("trips.txt", trips_text, ("route_id", "service_id", "trip_id"))
    headers: dict[str, tuple[int, dict[str, str]]] = {}
    for line, row in trips:
        trip_id = trips.required(row, "trip_id", line)
        if trip_id in headers:
            raise trips.error(f"trip {trip_id!r} already exists", line)
        headers[trip_id] = (line, row)
    calls: dict[str, dict[int, StopTime]] = {trip_id: {} for trip_id in headers}
    table = _Table(
        "stop_times.txt", stop_times_text, ("trip_id", "arrival_time", "departure_time", "stop_id", "stop_sequence")
    )
    for line, row in table:
        if row["trip_id"] not in calls:
            raise table.error(f"unknown trip {row['trip_id']!r}", line)
        if row["stop_id"] not in timetable.stops:
            raise table.error(f"unknown stop {row['stop_id']!r}", line)
        arrival_text = row["arrival_time"] or row["departure_time"]
        departure_text = row["departure_time"] or row["arrival_time"]
        if not arrival_text:
            raise table.error("a stop time needs an arrival or a departure time", line)
        if not row["stop_sequence"].isdigit():
            raise table.error(f"invalid stop_sequence {row['stop_sequence']!r}", line)
        sequence = int(row["stop_sequence"])
        if sequence in calls[row["trip_id"]]:
            raise table.error(f"stop_sequence {sequence} repeats in trip {row['trip_id']!r}", line)
        try:
            call = StopTime(row["stop_id"], parse_time(arrival_text), parse_time(departure_text))
        except RoutesError as exc:
            raise table.error(str(exc), line) from None
        calls[row["trip_id"]][sequence] = call
    for trip_id, (line, row) in headers.items():
        stop_times = tuple(call for _, call in sorted(calls[trip_id].items()))
        try:
            trip = Trip(trip_id, row["route_id"], row["service_id"], stop_times, row.get("trip_headsign", ""))
            timetable.add_trip(trip)
        except RoutesError as exc:
            raise trips.error(str(exc), line) from None


def _load_transfers(timetable: Timetable, text: str) -> None:
    table = _Table("transfers.txt", text, ("from_stop_id", "to_stop_id", "min_transfer_time"))
    for line, row in table:
        seconds = row["min_transfer_time"]
        if not seconds.isdigit():
            raise table.error(f"invalid min_transfer_time {seconds!r}", line)
        try:
            timetable.add_transfer(row["from_stop_id"], row["to_stop_id"], int(seconds))
        except RoutesError as exc:
            raise table.error(str(exc), line) from None
