"""The ledger's error types: every failure the package raises is a `LedgerError`."""

from __future__ import annotations


class LedgerError(Exception):
    """Base class of all ledger errors."""


class ValidationError(LedgerError, ValueError):
    """A value is malformed or out of range; `field` names what was wrong."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class CurrencyMismatchError(LedgerError, ValueError):
    """Two amounts in different currencies were combined."""

    def __init__(self, left: str, right: str) -> None:
        super().__init__(f"cannot combine {left} with {right}")
        self.left = left
        self.right = right


class UnknownPersonError(LedgerError, KeyError):
    """A person id is not part of the ledger."""

    def __init__(self, person_id: str) -> None:
        super().__init__(person_id)
        self.person_id = person_id

    def __str__(self) -> str:
        return f"unknown person {self.person_id!r}"


class SplitError(ValidationError):
    """An expense cannot be split as requested."""

    def __init__(self, message: str) -> None:
        super().__init__(message, field="split")


def require(condition: bool, message: str, field: str | None = None) -> None:
    """Raises `ValidationError(message, field)` unless `condition` holds."""
    if not condition:
        raise ValidationError(message, field)
