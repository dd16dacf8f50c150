"""Error types of the inventory package, and the validation helpers that raise them."""

from __future__ import annotations

import re


class InventoryError(Exception):
    """Base class of all inventory errors."""


class ValidationError(InventoryError, ValueError):
    """A value is malformed or out of range."""


class UnknownItemError(InventoryError, KeyError):
    """No item with this SKU is registered."""

    def __init__(self, sku: str) -> None:
        super().__init__(sku)
        self.sku = sku

    def __str__(self) -> str:
        return f"unknown item {self.sku!r}"


class UnknownLocationError(InventoryError, KeyError):
    """No location with this code exists."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        return f"unknown location {self.code!r}"


class InsufficientStockError(InventoryError):
    """More was requested than is available."""

    def __init__(self, sku: str, requested: int, available: int, location: str | None = None) -> None:
        where = f" at {location}" if location else ""
        super().__init__(f"{sku}{where}: requested {requested}, only {available} available")
        self.sku = sku
        self.requested = requested
        self.available = available
        self.location = location


class CapacityError(InventoryError):
    """A location cannot hold more units."""


class ReservationError(InventoryError):
    """A reservation cannot be changed as requested."""


_CODE = re.compile(r"^[A-Z0-9][A-Z0-9-]*$")


def validate_code(value: str, what: str) -> str:
    """Returns `value` if it is an upper-case code ("SKU-1", "A-01"), else raises."""
    if not isinstance(value, str) or not _CODE.match(value):
        raise ValidationError(f"invalid {what} {value!r}: use upper-case letters, digits and '-'")
    return value


def require_positive(quantity: int, what: str = "quantity") -> int:
    """Returns `quantity` if it is an integer > 0, else raises `ValidationError`."""
    if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity <= 0:
        raise ValidationError(f"{what} must be a positive integer, got {quantity!r}")
    return quantity


def require_non_negative(value: int, what: str) -> int:
    """Returns `value` if it is an integer >= 0, else raises `ValidationError`."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValidationError(f"{what} must be a non-negative integer, got {value!r}")
    return value
