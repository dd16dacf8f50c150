"""`Warehouse`: the service that ties items, locations, movements, valuation,
reservations and reorder rules together. All stock changes go through it."""

from __future__ import annotations

from datetime import date, timedelta

from .errors import (
    CapacityError,
    InsufficientStockError,
    InventoryError,
    ReservationError,
    UnknownItemError,
    UnknownLocationError,
    ValidationError,
    require_non_negative,
    require_positive,
)
from .models import DEFAULT_VALUATION, Item, Location, Movement, MovementKind
from .movements import MovementLedger
from .reorder import ReorderRule, ReorderSuggestion
from .reservations import Reservation, ReservationBook
from .valuation import ValuationMethod, create_valuation, round_half_up


class Warehouse:
    """A warehouse with its items, locations and stock.

    Available stock is what is on hand minus what is reserved; issues may not dip into
    reserved stock unless they fulfil the reservation.
    """

    def __init__(self) -> None:
        self._items: dict[str, Item] = {}
        self._locations: dict[str, Location] = {}
        self._valuations: dict[str, ValuationMethod] = {}
        self._rules: dict[str, ReorderRule] = {}
        self._on_order: dict[str, int] = {}
        self.movements = MovementLedger()
        self.reservations = ReservationBook()

    # -- master data --------------------------------------------------------------------

    def add_item(self, sku: str, name: str, unit: str = "ea", valuation: str = DEFAULT_VALUATION) -> Item:
        if sku in self._items:
            raise InventoryError(f"item {sku} already exists")
        item = Item(sku, name, unit, valuation)
        self._valuations[sku] = create_valuation(valuation, sku)
        self._items[sku] = item
        return item

    def item(self, sku: str) -> Item:
        try:
            return self._items[sku]
        except KeyError:
            raise UnknownItemError(sku) from None

    def add_location(self, code: str, name: str = "", capacity: int | None = None) -> Location:
        if code in self._locations:
            raise InventoryError(f"location {code} already exists")
        location = Location(code, name, capacity)
        self._locations[code] = location
        return location

    def location(self, code: str) -> Location:
        try:
            return self._locations[code]
        except KeyError:
            raise UnknownLocationError(code) from None

    def _check_capacity(self, code: str, incoming: int) -> None:
        capacity = self.location(code).capacity
        if capacity is None:
            return
        used = self.movements.units_at(code)
        if used + incoming > capacity:
            raise CapacityError(f"location {code} holds {used} of {capacity}; cannot add {incoming}")

    # -- stock levels -------------------------------------------------------------------

    def on_hand(self, sku: str, location: str | None = None) -> int:
        self.item(sku)
        if location is not None:
            self.location(location)
        return self.movements.on_hand(sku, location)

    def available(self, sku: str, on: date | None = None) -> int:
        """On hand minus reserved (reservations active on `on`)."""
        return self.on_hand(sku) - self.reservations.reserved(sku, on)

    def stock_value(self, sku: str | None = None) -> int:
        """Value in cents of one item's stock, or of all stock."""
        if sku is not None:
            self.item(sku)
            return self._valuations[sku].value
        return sum(v.value for v in self._valuations.values())

    def unit_cost(self, sku: str) -> int:
        self.item(sku)
        return self._valuations[sku].unit_cost

    # -- movements ----------------------------------------------------------------------

    def receive(
        self, sku: str, quantity: int, location: str, unit_cost: int, on: date, reference: str = ""
    ) -> Movement:
        """Books goods in at `location`, bought at `unit_cost` cents each."""
        self.item(sku)
        require_positive(quantity)
        self.movements.check_date(on)
        self._check_capacity(location, quantity)
        self._valuations[sku].receive(quantity, unit_cost)
        self._on_order[sku] = max(0, self._on_order.get(sku, 0) - quantity)
        return self.movements.record(
            MovementKind.RECEIPT, sku, quantity, on, destination=location, unit_cost=unit_cost, reference=reference
        )

    def _take(self, sku: str, quantity: int, location: str, on: date, kind: MovementKind, reference: str) -> Movement:
        at_location = self.on_hand(sku, location)
        if quantity > at_location:
            raise InsufficientStockError(sku, quantity, at_location, location)
        self.movements.check_date(on)
        cost = self._valuations[sku].issue(quantity)
        return self.movements.record(
            kind, sku, quantity, on, source=location, unit_cost=round_half_up(cost, quantity), reference=reference
        )

    def issue(self, sku: str, quantity: int, location: str, on: date, reference: str = "") -> Movement:
        """Takes goods out of `location` (shipping, consumption). Reserved stock stays put."""
        require_positive(quantity)
        free = self.available(sku, on)
        if quantity > free:
            raise InsufficientStockError(sku, quantity, max(free, 0))
        return self._take(sku, quantity, location, on, MovementKind.ISSUE, reference)

    def transfer(
        self, sku: str, quantity: int, source: str, destination: str, on: date, reference: str = ""
    ) -> Movement:
        """Moves goods between locations; their value is unchanged."""
        require_positive(quantity)
        self.location(destination)
        at_source = self.on_hand(sku, source)
        if quantity > at_source:
            raise InsufficientStockError(sku, quantity, at_source, source)
        self._check_capacity(destination, quantity)
        return self.movements.record(
            MovementKind.TRANSFER, sku, quantity, on, source=source, destination=destination, reference=reference
        )

    def adjust(
        self, sku: str, location: str, change: int, on: date, unit_cost: int | None = None, reference: str = ""
    ) -> Movement:
        """Corrects the stock at `location` by `change` units (found or lost goods).

        Found goods are valued at `unit_cost`, or at the item's current unit cost.
        """
        if change == 0:
            raise ValidationError("an adjustment must change the stock")
        if change < 0:
            return self._take(sku, -change, location, on, MovementKind.ADJUSTMENT, reference)
        self.item(sku)
        self.movements.check_date(on)
        self._check_capacity(location, change)
        cost = self._valuations[sku].unit_cost if unit_cost is None else unit_cost
        self._valuations[sku].receive(change, cost)
        return self.movements.record(
            MovementKind.ADJUSTMENT, sku, change, on, destination=location, unit_cost=cost, reference=reference
        )

    # -- reservations -------------------------------------------------------------------

    def reserve(self, sku: str, quantity: int, order: str, on: date, days: int | None = None) -> Reservation:
        """Holds stock for `order`, for `days` days from `on` (or until released)."""
        expires_on = None if days is None else on + timedelta(days=require_non_negative(days, "days"))
        return self.reservations.reserve(sku, quantity, order, self.available(sku, on), expires_on)

    def fulfil(self, reservation_id: int, location: str, on: date, quantity: int | None = None) -> Movement:
        """Issues reserved stock from `location` for the reservation's order."""
        reservation = self.reservations.get(reservation_id)
        if not reservation.is_active(on):
            raise InventoryError(f"reservation {reservation_id} is not active on {on}")
        wanted = reservation.quantity if quantity is None else require_positive(quantity)
        if wanted > reservation.quantity:
            raise ReservationError(f"reservation {reservation_id} holds only {reservation.quantity}")
        movement = self._take(reservation.sku, wanted, location, on, MovementKind.ISSUE, reservation.order)
        self.reservations.consume(reservation_id, wanted)
        return movement

    # -- replenishment ------------------------------------------------------------------

    def set_reorder_rule(self, rule: ReorderRule) -> None:
        self.item(rule.sku)
        self._rules[rule.sku] = rule

    def place_order(self, sku: str, quantity: int) -> None:
        """Notes that `quantity` units were ordered from a supplier (received later)."""
        self.item(sku)
        self._on_order[sku] = self._on_order.get(sku, 0) + require_positive(quantity)

    def on_order(self, sku: str) -> int:
        return self._on_order.get(sku, 0)

    def reorder_suggestions(self, on: date, period_days: int = 30) -> list[ReorderSuggestion]:
        """Items whose rule says to order now, by SKU; demand is estimated from the units
        issued in the `period_days` days up to and including `on`."""
        suggestions = []
        for sku in sorted(self._rules):
            rule = self._rules[sku]
            issued = self.movements.issued(sku, on - timedelta(days=period_days - 1), on)
            demand = rule.lead_time_demand(issued, period_days)
            available, on_order = self.available(sku, on), self.on_order(sku)
            quantity = rule.order_quantity(available, on_order, demand)
            if quantity > 0:
                suggestions.append(ReorderSuggestion(sku, available, on_order, demand, quantity))
        return suggestions
