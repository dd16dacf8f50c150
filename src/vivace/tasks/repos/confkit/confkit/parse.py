"""The configuration text format: reading (`parse`, `parse_value`) and writing (`dumps`).

    # comments start with '#' or ';' (at the start of a line or after a space)
    name = "demo"            ; keys before any section are top-level

    [server]
    host = localhost         # bare text is a string
    port = 8080              # integers (1_000 is allowed), floats, true / false
    timeout = 1h30m
    tags = ["a", 'b', 3]     # single-line lists, items of any type

    [server.tls]             # dotted section names nest
    cert = "/etc/cert.pem"

Double-quoted strings know the escapes \\ \" \n \t \r; single-quoted strings are
taken literally. A key is set once; a section is opened once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import keys as keymod
from .errors import KeyConflictError, ParseError

_INT_RE = re.compile(r"[+-]?\d+(?:_\d+)*")
_FLOAT_RE = re.compile(r"[+-]?\d+(?:_\d+)*(?:\.\d+(?:_\d+)*(?:[eE][+-]?\d+)?|[eE][+-]?\d+)")
_SECTION_RE = re.compile(r"\[\s*([^\]]*?)\s*\]\s*(?:[#;].*)?")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
_WRITE_ESCAPES = {value: "\\" + name for name, value in _ESCAPES.items()}


@dataclass
class Document:
    """Parsed text: `values` by dotted key in file order, `lines` the line setting each key."""

    source: str = "<string>"
    values: dict[str, Any] = field(default_factory=dict)
    lines: dict[str, int] = field(default_factory=dict)

    def origin(self, key: str) -> str:
        """Where `key` was set, as "source:line"."""
        return f"{self.source}:{self.lines[key]}"


def scalar(token: str) -> Any:
    """The value of an unquoted token: a bool, int or float if it reads as one, else the text."""
    if token == "true":
        return True
    if token == "false":
        return False
    if _INT_RE.fullmatch(token):
        return int(token.replace("_", ""))
    if _FLOAT_RE.fullmatch(token):
        return float(token.replace("_", ""))
    return token


class _ValueReader:
    """Reads one value from the text after '=' (or from an override)."""

    def __init__(self, text: str, line: int, source: str) -> None:
        self.text = text
        self.pos = 0
        self.line = line
        self.source = source

    def fail(self, message: str) -> ParseError:
        return ParseError(message, self.line, self.source)

    def skip_spaces(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def at_end(self) -> bool:
        """Whether only spaces and a comment are left."""
        self.skip_spaces()
        return self.pos >= len(self.text) or self.text[self.pos] in "#;"

    def read(self) -> Any:
        self.skip_spaces()
        if self.pos < len(self.text) and self.text[self.pos] in "\"'[":
            value = self.read_item()
            if not self.at_end():
                raise self.fail(f"unexpected text after value: {self.text[self.pos:].strip()!r}")
            return value
        return scalar(self.read_bare().strip())

    def read_bare(self) -> str:
        """Text up to the end of the line or a comment that follows a space."""
        start = self.pos
        while self.pos < len(self.text):
            if self.text[self.pos] in "#;" and (self.pos == 0 or self.text[self.pos - 1] in " \t"):
                break
            self.pos += 1
        return self.text[start : self.pos]

    def read_item(self) -> Any:
        char = self.text[self.pos]
        if char == '"':
            return self.read_quoted()
        if char == "'":
            return self.read_literal()
        if char == "[":
            return self.read_list()
        start = self.pos
        while self.pos < len(self.text) and self.text[self.pos] not in ",]":
            self.pos += 1
        token = self.text[start : self.pos].strip()
        if not token:
            raise self.fail("empty list item")
        return scalar(token)

    def read_quoted(self) -> str:
        self.pos += 1
        out: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char == '"':
                self.pos += 1
                return "".join(out)
            if char == "\\":
                escape = self.text[self.pos + 1 : self.pos + 2]
                if escape not in _ESCAPES:
                    raise self.fail(f"unknown escape \\{escape}")
                out.append(_ESCAPES[escape])
                self.pos += 2
                continue
            out.append(char)
            self.pos += 1
        raise self.fail("unterminated string")

    def read_literal(self) -> str:
        end = self.text.find("'", self.pos + 1)
        if end < 0:
            raise self.fail("unterminated string")
        value = self.text[self.pos + 1 : end]
        self.pos = end + 1
        return value

    def read_list(self) -> list[Any]:
        self.pos += 1
        items: list[Any] = []
        while True:
            self.skip_spaces()
            if self.pos >= len(self.text):
                raise self.fail("unterminated list")
            if self.text[self.pos] == "]":
                self.pos += 1
                return items
            items.append(self.read_item())
            self.skip_spaces()
            if self.pos < len(self.text) and self.text[self.pos] == ",":
                self.pos += 1
            elif self.pos < len(self.text) and self.text[self.pos] != "]":
                raise self.fail("expected ',' or ']' in list")


def parse_value(text: str, line: int = 0, source: str = "<string>") -> Any:
    """The value written as `text` (what follows '=' in a file, or an override's value)."""
    return _ValueReader(text, line, source).read()


def parse(text: str, source: str = "<string>") -> Document:
    """Parses configuration text; errors are `ParseError`s naming the source and line."""
    doc = Document(source)
    section = ""
    opened: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            match = _SECTION_RE.fullmatch(line)
            if match is None:
                raise ParseError("malformed section header", number, source)
            section = match.group(1)
            if not keymod.is_key(section):
                raise ParseError(f"invalid section name {section!r}", number, source)
            if section in opened:
                raise ParseError(f"section [{section}] is already defined on line {opened[section]}", number, source)
            opened[section] = number
            continue
        name, equals, rest = line.partition("=")
        if not equals:
            raise ParseError("expected 'key = value' or '[section]'", number, source)
        name = name.strip()
        if not keymod.is_key(name):
            raise ParseError(f"invalid key {name!r}", number, source)
        key = keymod.join(section, name)
        if key in doc.values:
            raise ParseError(f"duplicate key {key!r} (first set on line {doc.lines[key]})", number, source)
        doc.values[key] = parse_value(rest, number, source)
        doc.lines[key] = number
    try:
        keymod.check_conflicts(doc.values)
    except KeyConflictError as error:
        raise ParseError(str(error), max(doc.lines[error.key], doc.lines[error.other]), source) from None
    return doc


def format_value(value: Any) -> str:
    """`value` written in the text format, so that `parse_value` reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"cannot write the non-finite number {value!r}")
        return repr(value)
    if isinstance(value, str):
        return '"' + "".join(_WRITE_ESCAPES.get(char, char) for char in value) + '"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(item) for item in value) + "]"
    raise TypeError(f"cannot write a value of type {type(value).__name__}")


def dumps(values: Mapping[str, Any]) -> str:
    """Text for flat `values`: top-level keys first, then one block per section, in order."""
    groups: dict[str, list[str]] = {"": []}
    for key, value in values.items():
        section, name = keymod.split(key)
        groups.setdefault(section, []).append(f"{name} = {format_value(value)}")
    blocks = []
    for section, lines in groups.items():
        if not lines:
            continue
        header = [f"[{section}]"] if section else []
        blocks.append("\n".join(header + lines))
    return "\n\n".join(blocks) + "\n" if blocks else ""
