"""Reservations: stock promised to orders but not yet issued."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from enum import StrEnum

from .errors import InsufficientStockError, ReservationError, require_positive


class ReservationStatus(StrEnum):
    ACTIVE = "active"
    FULFILLED = "fulfilled"
    RELEASED = "released"
    EXPIRED = "expired"


@dataclass
class Reservation:
    """`quantity` units of `sku` held for `order`; it lapses after `expires_on`."""

    id: int
    sku: str
    quantity: int
    order: str
    expires_on: date | None = None
    status: ReservationStatus = ReservationStatus.ACTIVE

    def is_active(self, on: date | None = None) -> bool:
        """Active and, if `on` is given, not past its expiry date on that day."""
        if self.status is not ReservationStatus.ACTIVE:
            return False
        return on is None or self.expires_on is None or on <= self.expires_on


class ReservationBook:
    """All reservations, by id (ids start at 1)."""

    def __init__(self) -> None:
        self._reservations: dict[int, Reservation] = {}

    def reserve(
        self, sku: str, quantity: int, order: str, available: int, expires_on: date | None = None
    ) -> Reservation:
        """Holds `quantity` units of `sku` for `order`, if `available` units are enough."""
        require_positive(quantity)
        if quantity > available:
            raise InsufficientStockError(sku, quantity, available)
        reservation = Reservation(len(self._reservations) + 1, sku, quantity, order, expires_on)
        self._reservations[reservation.id] = reservation
        return reservation

    def get(self, reservation_id: int) -> Reservation:
        try:
            return self._reservations[reservation_id]
        except KeyError:
            raise ReservationError(f"no reservation {reservation_id}") from None

    def _active(self, reservation_id: int) -> Reservation:
        reservation = self.get(reservation_id)
        if reservation.status is not ReservationStatus.ACTIVE:
            raise ReservationError(f"reservation {reservation_id} is {reservation.status}")
        return reservation

    def reserved(self, sku: str, on: date | None = None) -> int:
        """Units of `sku` held by reservations active on `on` (or now)."""
        return sum(r.quantity for r in self._reservations.values() if r.sku == sku and r.is_active(on))

    def active(self, sku: str | None = None, on: date | None = None) -> list[Reservation]:
        """Active reservations (of `sku`, if given), oldest first."""
        return [r for r in self._reservations.values() if (sku is None or r.sku == sku) and r.is_active(on)]

    def release(self, reservation_id: int) -> Reservation:
        """Cancels an active reservation; its units become available again."""
        reservation = self._active(reservation_id)
        reservation.status = ReservationStatus.RELEASED
        return reservation

    def consume(self, reservation_id: int, quantity: int | None = None) -> int:
        """Marks `quantity` units (default: all) as fulfilled and returns that quantity.

        A partial fulfilment keeps the rest reserved; `quantity` is what is still held.
        """
        reservation = self._active(reservation_id)
        taken = reservation.quantity if quantity is None else require_positive(quantity)
        if taken > reservation.quantity:
            raise ReservationError(f"reservation {reservation_id} holds only {reservation.quantity}")
        reservation.quantity -= taken
        if reservation.quantity == 0:
            reservation.status = ReservationStatus.FULFILLED
        return taken

    def expire(self, on: date) -> list[Reservation]:
        """Marks active reservations whose expiry date is before `on` as expired; returns them."""
        lapsed = [
            r for r in self._reservations.values() if r.status is ReservationStatus.ACTIVE and not r.is_active(on)
        ]
        for reservation in lapsed:
            reservation.status = ReservationStatus.EXPIRED
        return lapsed
