"""The error types of confkit: every failure the package raises is a `ConfigError`."""

from __future__ import annotations


class ConfigError(Exception):
    """Base class of all configuration errors."""


class ParseError(ConfigError, ValueError):
    """Configuration text is malformed.

    `source` names the text (a file name, "<string>", "override"), `line` is the 1-based
    line number, or 0 when the error is not tied to a line.
    """

    def __init__(self, message: str, line: int = 0, source: str = "<string>") -> None:
        where = f"{source}:{line}" if line else source
        super().__init__(f"{where}: {message}")
        self.message = message
        self.line = line
        self.source = source


class KeyConflictError(ConfigError, ValueError):
    """A key is used both as a value and as a section (`server = 1` and `server.port = 2`)."""

    def __init__(self, key: str, other: str) -> None:
        super().__init__(f"{key!r} is both a value and a section (it contains {other!r})")
        self.key = key
        self.other = other


class MissingKeyError(ConfigError, KeyError):
    """A key is not set in the configuration."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key

    def __str__(self) -> str:
        return f"no setting {self.key!r}"


class ValidationError(ConfigError, ValueError):
    """A value does not fit its field.

    Fields raise it with the message only; the schema fills in `key` and, where known,
    `origin` (where the value came from, such as "app.conf:12" or "env:APP_PORT").
    """

    def __init__(self, message: str, key: str | None = None, origin: str | None = None) -> None:
        text = f"{key}: {message}" if key else message
        if origin:
            text = f"{text} (from {origin})"
        super().__init__(text)
        self.message = message
        self.key = key
        self.origin = origin


class SchemaError(ConfigError, ValueError):
    """Several values failed validation; `errors` lists them all, in key order."""

    def __init__(self, errors: list[ValidationError]) -> None:
        lines = "\n".join(f"  {error}" for error in errors)
        noun = "setting" if len(errors) == 1 else "settings"
        super().__init__(f"{len(errors)} invalid {noun}:\n{lines}")
        self.errors = errors


class InterpolationError(ConfigError, ValueError):
    """A `${...}` reference in `key` cannot be resolved."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


class CycleError(InterpolationError):
    """References form a cycle; `chain` is the cycle, starting and ending with the same key."""

    def __init__(self, chain: list[str]) -> None:
        super().__init__(chain[0], "reference cycle " + " -> ".join(chain))
        self.chain = chain


class SourceError(ConfigError):
    """A configuration source cannot be read (a missing or unreadable file)."""
