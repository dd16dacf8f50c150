"""The ledger's records: people, expenses and settlement payments."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date

from .constants import PERSON_ID_PATTERN
from .errors import ValidationError, require
from .money import Money
from .splits import get_strategy


def validate_person_id(person_id: str) -> str:
    """Returns `person_id` if it is well-formed, else raises `ValidationError`."""
    if not isinstance(person_id, str) or re.fullmatch(PERSON_ID_PATTERN, person_id) is None:
        raise ValidationError(f"invalid person id {person_id!r}", field="person")
    return person_id


@dataclass(frozen=True)
class Person:
    """Someone who shares expenses; `id` is short and stable, `name` is for display."""

    id: str
    name: str = ""

    def __post_init__(self) -> None:
        validate_person_id(self.id)
        if not self.name:
            object.__setattr__(self, "name", self.id.replace("_", " ").title())


@dataclass
class Expense:
    """Something `payer` paid for on behalf of `participants` (who may include the payer)."""

    description: str
    payer: str
    amount: Money
    participants: tuple[str, ...]
    on: date
    split: str = "equal"
    params: Mapping[str, str] = field(default_factory=dict)
    id: int | None = None

    def __post_init__(self) -> None:
        self.participants = tuple(self.participants)
        self.params = dict(self.params)
        require(bool(self.description.strip()), "an expense needs a description", "description")
        validate_person_id(self.payer)
        for person in self.participants:
            validate_person_id(person)
        require(self.amount.is_positive(), f"an expense amount must be positive, got {self.amount}", "amount")

    def shares(self) -> dict[str, Money]:
        """What each participant owes for this expense (adds up to `amount`)."""
        return get_strategy(self.split).split(self.amount, self.participants, self.params)

    def share_of(self, person: str) -> Money:
        """`person`'s part of the expense (zero for non-participants)."""
        return self.shares().get(person, Money.zero(self.amount.currency))


@dataclass(frozen=True)
class Payment:
    """A settlement: `payer` gave `payee` money outside of any expense."""

    payer: str
    payee: str
    amount: Money
    on: date

    def __post_init__(self) -> None:
        validate_person_id(self.payer)
        validate_person_id(self.payee)
        require(self.payer != self.payee, "a payment needs two different people", "payee")
        require(self.amount.is_positive(), f"a payment must be positive, got {self.amount}", "amount")
