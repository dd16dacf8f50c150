"""Records of the inventory: items, locations and stock movements."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from enum import StrEnum

from .errors import ValidationError, require_non_negative, require_positive, validate_code

#: Valuation method of items that name none.
DEFAULT_VALUATION = "fifo"


class MovementKind(StrEnum):
    """What a movement does. Receipts bring stock in, issues take it out, transfers move it
    between locations and adjustments correct it (in either direction)."""

    RECEIPT = "receipt"
    ISSUE = "issue"
    TRANSFER = "transfer"
    ADJUSTMENT = "adjustment"


@dataclass(frozen=True)
class Item:
    """A stock-keeping unit: `sku` identifies it, `unit` is what one quantity means."""

    sku: str
    name: str
    unit: str = "ea"
    valuation: str = DEFAULT_VALUATION

    def __post_init__(self) -> None:
        validate_code(self.sku, "SKU")
        if not self.name.strip():
            raise ValidationError(f"item {self.sku} needs a name")


@dataclass(frozen=True)
class Location:
    """A place stock is kept (a bin, shelf or zone). `capacity` limits the units it holds."""

    code: str
    name: str = ""
    capacity: int | None = None

    def __post_init__(self) -> None:
        validate_code(self.code, "location code")
        if self.capacity is not None:
            require_non_negative(self.capacity, "capacity")


@dataclass(frozen=True)
class Movement:
    """One entry of the movement ledger. Quantities are always positive; the direction is
    given by `source` (stock leaves it) and `destination` (stock arrives there).

    `unit_cost` is in cents: the purchase cost for receipts, the cost of goods for issues.
    """

    seq: int
    kind: MovementKind
    sku: str
    quantity: int
    on: date
    source: str | None = None
    destination: str | None = None
    unit_cost: int | None = None
    reference: str = ""

    def __post_init__(self) -> None:
        require_positive(self.quantity)
        if self.unit_cost is not None:
            require_non_negative(self.unit_cost, "unit cost")
        has_source, has_destination = self.source is not None, self.destination is not None
        expected = {
            MovementKind.RECEIPT: (False, True),
            MovementKind.ISSUE: (True, False),
            MovementKind.TRANSFER: (True, True),
        }.get(self.kind)
        if expected is None:  # an adjustment goes one way or the other
            if has_source == has_destination:
                raise ValidationError("an adjustment needs exactly one of source and destination")
        elif (has_source, has_destination) != expected:
            raise ValidationError(f"a {self.kind} movement has the wrong source/destination")
        if self.kind is MovementKind.TRANSFER and self.source == self.destination:
            raise ValidationError("a transfer needs two different locations")

    def delta(self, location: str | None = None) -> int:
        """How this movement changes stock at `location` (or in the whole warehouse)."""
        change = 0
        if self.destination is not None and (location is None or self.destination == location):
            change += self.quantity
        if self.source is not None and (location is None or self.source == location):
            change -= self.quantity
        return change
