"""The movement ledger: an append-only journal from which stock levels are derived."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import date

from .errors import ValidationError
from .models import Movement, MovementKind


class MovementLedger:
    """Every stock movement in the order it was recorded; `seq` numbers start at 1."""

    def __init__(self) -> None:
        self._movements: list[Movement] = []

    def record(
        self,
        kind: MovementKind,
        sku: str,
        quantity: int,
        on: date,
        *,
        source: str | None = None,
        destination: str | None = None,
        unit_cost: int | None = None,
        reference: str = "",
    ) -> Movement:
        """Appends a movement (validated by `Movement`) and returns it."""
        self.check_date(on)
        movement = Movement(
            seq=len(self._movements) + 1,
            kind=MovementKind(kind),
            sku=sku,
            quantity=quantity,
            on=on,
            source=source,
            destination=destination,
            unit_cost=unit_cost,
            reference=reference,
        )
        self._movements.append(movement)
        return movement

    def check_date(self, on: date) -> None:
        """Raises `ValidationError` if a movement dated `on` would be out of date order."""
        if self._movements and on < self._movements[-1].on:
            raise ValidationError(f"movements must be recorded in date order: {on} is before {self._movements[-1].on}")

    def __iter__(self) -> Iterator[Movement]:
        return iter(self._movements)

    def __len__(self) -> int:
        return len(self._movements)

    def history(self, sku: str, kind: MovementKind | None = None) -> list[Movement]:
        """The movements of `sku` (optionally of one kind), oldest first."""
        return [m for m in self._movements if m.sku == sku and (kind is None or m.kind == kind)]

    def on_hand(self, sku: str, location: str | None = None, as_of: date | None = None) -> int:
        """Units of `sku` at `location` (or anywhere), after the movements up to `as_of`."""
        return sum(m.delta(location) for m in self._movements if m.sku == sku and (as_of is None or m.on <= as_of))

    def by_location(self, sku: str) -> dict[str, int]:
        """Units of `sku` per location, for locations that hold some, sorted by code."""
        totals: dict[str, int] = {}
        for m in self.history(sku):
            for code in (m.source, m.destination):
                if code is not None:
                    totals[code] = totals.get(code, 0) + m.delta(code)
        return {code: qty for code, qty in sorted(totals.items()) if qty != 0}

    def units_at(self, location: str) -> int:
        """Units of all items at `location`."""
        return sum(m.delta(location) for m in self._movements)

    def issued(self, sku: str, start: date, end: date) -> int:
        """Units of `sku` issued from `start` to `end`, both included (the demand)."""
        if end < start:
            raise ValidationError(f"empty period: {start} to {end}")
        return sum(m.quantity for m in self.history(sku, MovementKind.ISSUE) if start <= m.on <= end)
