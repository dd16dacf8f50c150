"""Inventory valuation: what the stock on hand is worth and what issued goods cost.

A `ValuationMethod` tracks one item's quantity and value in cents. Subclasses implement
`_add` and `_take`; the public `receive` and `issue` validate first (template methods).
Methods are registered by name with `@register_method` and created with
`create_valuation(name)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

from .errors import InsufficientStockError, ValidationError, require_non_negative, require_positive

_METHODS: dict[str, type[ValuationMethod]] = {}


def register_method(cls: type[ValuationMethod]) -> type[ValuationMethod]:
    """Class decorator: makes the method available under `cls.name`."""
    if cls.name in _METHODS:
        raise ValueError(f"valuation method {cls.name!r} is already registered")
    _METHODS[cls.name] = cls
    return cls


def create_valuation(name: str, sku: str = "") -> ValuationMethod:
    """A fresh, empty valuation of method `name`."""
    try:
        return _METHODS[name](sku)
    except KeyError:
        raise ValidationError(f"unknown valuation method {name!r} (known: {', '.join(method_names())})") from None


def method_names() -> list[str]:
    return sorted(_METHODS)


def round_half_up(numerator: int, denominator: int) -> int:
    """`numerator / denominator` rounded to the nearest integer, halves away from zero."""
    if denominator <= 0:
        raise ValidationError("denominator must be positive")
    quotient, remainder = divmod(abs(numerator), denominator)
    if 2 * remainder >= denominator:
        quotient += 1
    return quotient if numerator >= 0 else -quotient


@dataclass
class CostLayer:
    """`quantity` units bought at `unit_cost` cents each."""

    quantity: int
    unit_cost: int

    @property
    def value(self) -> int:
        return self.quantity * self.unit_cost


class ValuationMethod(ABC):
    """One item's stock value under some costing method."""

    name: ClassVar[str]

    def __init__(self, sku: str = "") -> None:
        self.sku = sku

    @property
    @abstractmethod
    def quantity(self) -> int:
        """Units on hand."""

    @property
    @abstractmethod
    def value(self) -> int:
        """Value of the units on hand, in cents."""

    @property
    def unit_cost(self) -> int:
        """Average cost of a unit on hand, in cents (rounded); 0 when there is none."""
        if self.quantity == 0:
            return 0
        return round_half_up(self.value, self.quantity)

    def receive(self, quantity: int, unit_cost: int) -> None:
        """Adds `quantity` units bought at `unit_cost` cents each."""
        require_positive(quantity)
        require_non_negative(unit_cost, "unit cost")
        self._add(quantity, unit_cost)

    def issue(self, quantity: int) -> int:
        """Removes `quantity` units and returns their cost in cents."""
        require_positive(quantity)
        if quantity > self.quantity:
            raise InsufficientStockError(self.sku, quantity, self.quantity)
        return self._take(quantity)

    @abstractmethod
    def _add(self, quantity: int, unit_cost: int) -> None: ...

    @abstractmethod
    def _take(self, quantity: int) -> int: ...


class LayeredValuation(ValuationMethod):
    """Keeps each receipt as a cost layer; subclasses choose which layer is used up next."""

    def __init__(self, sku: str = "") -> None:
        super().__init__(sku)
        self.layers: list[CostLayer] = []

    @property
    def quantity(self) -> int:
        return sum(layer.quantity for layer in self.layers)

    @property
    def value(self) -> int:
        return sum(layer.value for layer in self.layers)

    def _add(self, quantity: int, unit_cost: int) -> None:
        self.layers.append(CostLayer(quantity, unit_cost))

    @abstractmethod
    def _next_layer(self) -> int:
        """Index in `layers` of the layer to consume next."""

    def _take(self, quantity: int) -> int:
        cost = 0
        while quantity > 0:
            index = self._next_layer()
            layer = self.layers[index]
            used = min(quantity, layer.quantity)
            cost += used * layer.unit_cost
            layer.quantity -= used
            quantity -= used
            if layer.quantity == 0:
                del self.layers[index]
        return cost


@register_method
class FIFOValuation(LayeredValuation):
    """First in, first out: issues use up the oldest receipts first."""

    name = "fifo"

    def _next_layer(self) -> int:
        return 0


@register_method
class AverageCostValuation(ValuationMethod):
    """Weighted average cost: every unit on hand is worth the same.

    The total value is kept exactly; an issue costs its proportional share of it
    (rounded half up), and issuing the last units takes all the remaining value.
    """

    name = "average"

    def __init__(self, sku: str = "") -> None:
        super().__init__(sku)
        self._quantity = 0
        self._value = 0

    @property
    def quantity(self) -> int:
        return self._quantity

    @property
    def value(self) -> int:
        return self._value

    def _add(self, quantity: int, unit_cost: int) -> None:
        self._quantity += quantity
        self._value += quantity * unit_cost

    def _take(self, quantity: int) -> int:
        if quantity == self._quantity:
            cost = self._value
        else:
            cost = round_half_up(self._value * quantity, self._quantity)
        self._quantity -= quantity
        self._value -= cost
        return cost
