"""Warehouse inventory: items, locations, a movement ledger, valuation, reservations and
reorder rules."""

from .errors import (
    CapacityError,
    InsufficientStockError,
    InventoryError,
    ReservationError,
    UnknownItemError,
    UnknownLocationError,
    ValidationError,
)
from .models import Item, Location, Movement, MovementKind
from .movements import MovementLedger
from .reorder import ReorderRule, ReorderSuggestion
from .reservations import Reservation, ReservationBook, ReservationStatus
from .valuation import ValuationMethod, create_valuation, method_names, register_method
from .warehouse import Warehouse

__all__ = [
    "CapacityError",
    "InsufficientStockError",
    "InventoryError",
    "Item",
    "Location",
    "Movement",
    "MovementKind",
    "MovementLedger",
    "ReorderRule",
    "ReorderSuggestion",
    "Reservation",
    "ReservationBook",
    "ReservationError",
    "ReservationStatus",
    "UnknownItemError",
    "UnknownLocationError",
    "ValidationError",
    "ValuationMethod",
    "Warehouse",
    "create_valuation",
    "method_names",
    "register_method",
]
