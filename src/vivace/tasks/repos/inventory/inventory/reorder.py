"""Reorder rules: when to buy more of an item, and how much."""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ValidationError, require_non_negative, require_positive


def ceil_div(numerator: int, denominator: int) -> int:
    """`numerator / denominator` rounded up (both non-negative, denominator > 0)."""
    return -(-numerator // denominator)


def round_up_to_pack(quantity: int, pack_size: int) -> int:
    """The smallest multiple of `pack_size` that is at least `quantity`."""
    require_positive(pack_size, "pack size")
    if quantity <= 0:
        return 0
    return ceil_div(quantity, pack_size) * pack_size


@dataclass(frozen=True)
class ReorderRule:
    """Min/max replenishment for one item.

    When the projected stock (available + on order - demand expected during the lead time)
    falls to `min_quantity` or below, order enough to bring it back up to `max_quantity`,
    rounded up to whole packs of `pack_size`.
    """

    sku: str
    min_quantity: int
    max_quantity: int
    pack_size: int = 1
    lead_time_days: int = 0

    def __post_init__(self) -> None:
        require_non_negative(self.min_quantity, "min quantity")
        require_non_negative(self.max_quantity, "max quantity")
        require_positive(self.pack_size, "pack size")
        require_non_negative(self.lead_time_days, "lead time")
        if self.max_quantity < self.min_quantity:
            raise ValidationError(f"max quantity {self.max_quantity} is below min quantity {self.min_quantity}")

    def lead_time_demand(self, issued: int, period_days: int) -> int:
        """Units expected to be issued during the lead time, given `issued` units in
        the last `period_days` days (rounded up)."""
        require_positive(period_days, "period")
        return ceil_div(issued * self.lead_time_days, period_days)

    def projected(self, available: int, on_order: int = 0, demand: int = 0) -> int:
        return available + on_order - demand

    def order_quantity(self, available: int, on_order: int = 0, demand: int = 0) -> int:
        """How much to order now (0 if the projected stock is above the minimum)."""
        projected = self.projected(available, on_order, demand)
        if projected > self.min_quantity:
            return 0
        return round_up_to_pack(self.max_quantity - projected, self.pack_size)


@dataclass(frozen=True)
class ReorderSuggestion:
    sku: str
    available: int
    on_order: int
    demand: int
    quantity: int
