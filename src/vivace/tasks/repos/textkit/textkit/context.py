"""The scope chain templates are rendered against, and the value of a missing variable."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

_MISSING = object()


class Undefined:
    """What a lookup of a missing name gives: renders empty, is falsy, iterates as empty."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __str__(self) -> str:
        return ""

    def __repr__(self) -> str:
        return f"Undefined({self.name!r})"

    def __bool__(self) -> bool:
        return False

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[Any]:
        return iter(())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Undefined)

    def __hash__(self) -> int:
        return hash(Undefined)


def get_attribute(obj: Any, part: str) -> Any:
    """One step of a dotted lookup: a mapping key, a sequence index, or a public attribute.

    Returns the module's `_MISSING` marker (not an exception) when there is nothing there.
    """
    if isinstance(obj, Mapping):
        return obj.get(part, _MISSING)
    if isinstance(obj, Sequence) and not isinstance(obj, str) and part.isdigit():
        index = int(part)
        return obj[index] if index < len(obj) else _MISSING
    if part.startswith("_"):
        return _MISSING
    return getattr(obj, part, _MISSING)


class Context:
    """A scope: its own variables, and the enclosing scope consulted for the rest.

    Loops push a child scope, so names they bind disappear when the loop ends.
    """

    def __init__(self, data: Mapping[str, Any] | None = None, parent: Context | None = None) -> None:
        self._vars: dict[str, Any] = dict(data or {})
        self.parent = parent

    def push(self, data: Mapping[str, Any] | None = None) -> Context:
        """A new child scope of this one."""
        return Context(data, self)

    def set(self, name: str, value: Any) -> None:
        """Binds `name` in this scope (never in an enclosing one)."""
        self._vars[name] = value

    def lookup(self, name: str) -> Any:
        """The innermost binding of `name`; KeyError when no scope binds it."""
        scope: Context | None = self
        while scope is not None:
            if name in scope._vars:
                return scope._vars[name]
            scope = scope.parent
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        try:
            self.lookup(str(name))
        except KeyError:
            return False
        return True

    def resolve(self, path: Sequence[str]) -> Any:
        """The value of a dotted path such as ("user", "name"), or Undefined naming the gap."""
        try:
            value = self.lookup(path[0])
        except KeyError:
            return Undefined(path[0])
        for i in range(1, len(path)):
            value = get_attribute(value, path[i])
            if value is _MISSING:
                return Undefined(".".join(path[: i + 1]))
        return value

    @property
    def depth(self) -> int:
        """How many scopes the chain has, this one included."""
        return 1 if self.parent is None else self.parent.depth + 1

    def flatten(self) -> dict[str, Any]:
        """Every visible binding; inner scopes win over outer ones."""
        merged = {} if self.parent is None else self.parent.flatten()
        merged.update(self._vars)
        return merged
