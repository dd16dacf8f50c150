"""The filter registry and the built-in filters.

A filter is a function `f(value, *args)`; it is registered under a name with the number of
arguments it accepts, so the parser can reject `{{ x | upper(1) }}` before rendering. Filters
report bad input by raising FilterError (the renderer adds the line number).
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from . import text as textutil
from .context import Undefined
from .errors import FilterError

FilterFunc = Callable[..., Any]
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class FilterSpec:
    """A registered filter: its function and how many arguments it takes."""

    name: str
    func: FilterFunc
    min_args: int = 0
    max_args: int = 0
    handles_undefined: bool = False  # receives Undefined instead of failing in strict mode

    def arity_error(self, count: int) -> str | None:
        """Why `count` arguments are wrong for this filter, or None when they are fine."""
        if self.min_args <= count <= self.max_args:
            return None
        if self.min_args == self.max_args:
            expected = f"{self.min_args} argument{'' if self.min_args == 1 else 's'}"
        else:
            expected = f"{self.min_args} to {self.max_args} arguments"
        return f"filter {self.name!r} takes {expected}, got {count}"


class FilterRegistry:
    """Named filters; a registry made with `child()` sees its parent's filters too."""

    def __init__(self, parent: FilterRegistry | None = None) -> None:
        self._filters: dict[str, FilterSpec] = {}
        self._parent = parent

    def register(
        self, name: str, *, min_args: int = 0, max_args: int | None = None, handles_undefined: bool = False
    ) -> Callable[[FilterFunc], FilterFunc]:
        """Decorator registering a filter function under `name`."""

        def decorate(func: FilterFunc) -> FilterFunc:
            upper = min_args if max_args is None else max_args
            self.add(FilterSpec(name, func, min_args, upper, handles_undefined))
            return func

        return decorate

    def add(self, spec: FilterSpec) -> None:
        """Registers (or replaces, in this registry) a filter."""
        if not _NAME.match(spec.name):
            raise ValueError(f"invalid filter name {spec.name!r}")
        if spec.min_args < 0 or spec.max_args < spec.min_args:
            raise ValueError(f"filter {spec.name!r}: bad argument range {spec.min_args}..{spec.max_args}")
        self._filters[spec.name] = spec

    def get(self, name: str) -> FilterSpec:
        """The filter called `name`, here or in a parent; KeyError when there is none."""
        registry: FilterRegistry | None = self
        while registry is not None:
            if name in registry._filters:
                return registry._filters[name]
            registry = registry._parent
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        try:
            self.get(str(name))
        except KeyError:
            return False
        return True

    def names(self) -> list[str]:
        """Every filter name visible from this registry, sorted."""
        found = set(self._filters)
        if self._parent is not None:
            found.update(self._parent.names())
        return sorted(found)

    def child(self) -> FilterRegistry:
        """A registry that adds to (and may override) this one without changing it."""
        return FilterRegistry(parent=self)

    def apply(self, name: str, value: Any, args: Iterable[Any] = ()) -> Any:
        """Calls the filter `name` on `value`."""
        spec = self.get(name)
        return spec.func(value, *args)


def to_text(value: Any) -> str:
    """How a value prints in a template: None and Undefined are empty, booleans lowercase."""
    if value is None or isinstance(value, Undefined):
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def require_int(value: Any, filter_name: str, what: str = "argument") -> int:
    """`value` if it is an int (not a bool); FilterError otherwise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise FilterError(f"{filter_name}: {what} must be an integer, got {value!r}")
    return value


def require_number(value: Any, filter_name: str, what: str = "value") -> int | float:
    """`value` as a number: ints and floats pass, numeric strings are converted."""
    if isinstance(value, bool):
        raise FilterError(f"{filter_name}: {what} must be a number, got {value!r}")
    if isinstance(value, int | float):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
        try:
            return float(value)
        except ValueError:
            pass
    raise FilterError(f"{filter_name}: {what} must be a number, got {value!r}")


def require_sequence(value: Any, filter_name: str) -> list[Any]:
    """`value` as a list: any iterable but a string or a mapping; FilterError otherwise."""
    if isinstance(value, str | Mapping) or not isinstance(value, Iterable):
        raise FilterError(f"{filter_name}: expected a list, got {type(value).__name__}")
    return list(value)


default_filters = FilterRegistry()
register = default_filters.register


@register("upper")
def upper(value: Any) -> str:
    return to_text(value).upper()


@register("lower")
def lower(value: Any) -> str:
    return to_text(value).lower()


@register("title")
def title(value: Any) -> str:
    return to_text(value).title()


@register("capitalize")
def capitalize(value: Any) -> str:
    s = to_text(value)
    return s[:1].upper() + s[1:].lower()


@register("trim")
def trim(value: Any) -> str:
    return to_text(value).strip()


@register("default", min_args=1, max_args=2, handles_undefined=True)
def default(value: Any, fallback: Any, boolean: bool = False) -> Any:
    """`fallback` when the value is undefined or None (or, with `boolean`, any falsy value)."""
    if isinstance(value, Undefined) or value is None:
        return fallback
    if boolean and not value:
        return fallback
    return value


@register("join", max_args=1)
def join(value: Any, sep: str = "") -> str:
    return to_text(sep).join(to_text(v) for v in require_sequence(value, "join"))


@register("length")
def length(value: Any) -> int:
    try:
        return len(value)
    except TypeError:
        raise FilterError(f"length: {type(value).__name__} has no length") from None


@register("first")
def first(value: Any) -> Any:
    items = list(value) if isinstance(value, str) else require_sequence(value, "first")
    return items[0] if items else None


@register("last")
def last(value: Any) -> Any:
    items = list(value) if isinstance(value, str) else require_sequence(value, "last")
    return items[-1] if items else None


@register("reverse")
def reverse(value: Any) -> Any:
    if isinstance(value, str):
        return value[::-1]
    return require_sequence(value, "reverse")[::-1]


@register("sort", max_args=1)
def sort(value: Any, descending: bool = False) -> list[Any]:
    try:
        return sorted(require_sequence(value, "sort"), reverse=bool(descending))
    except TypeError:
        raise FilterError("sort: the items cannot be compared") from None


@register("truncate", max_args=2)
def truncate(value: Any, length: Any = 30, suffix: Any = "...") -> str:
    size = require_int(length, "truncate", "length")
    try:
        return textutil.truncate(to_text(value), size, to_text(suffix))
    except ValueError as e:
        raise FilterError(f"truncate: {e}") from None


@register("wordwrap", max_args=1)
def wordwrap(value: Any, width: Any = 79) -> str:
    size = require_int(width, "wordwrap", "width")
    if size < 1:
        raise FilterError(f"wordwrap: width must be at least 1, got {size}")
    return textutil.fill(to_text(value), size)


@register("slugify")
def slugify(value: Any) -> str:
    return textutil.slugify(to_text(value))


@register("replace", min_args=2, max_args=3)
def replace(value: Any, old: Any, new: Any, count: Any = -1) -> str:
    return to_text(value).replace(to_text(old), to_text(new), require_int(count, "replace", "count"))


@register("round", max_args=1)
def round_(value: Any, ndigits: Any = 0) -> int | float:
    number = require_number(value, "round")
    digits = require_int(ndigits, "round", "ndigits")
    return round(number) if digits == 0 else round(number, digits)


@register("int", max_args=1)
def to_int(value: Any, fallback: Any = 0) -> Any:
    try:
        return int(require_number(value, "int"))
    except FilterError:
        return fallback


@register("indent", max_args=1)
def indent(value: Any, width: Any = 4) -> str:
    return textutil.indent(to_text(value), require_int(width, "indent", "width"))


@register("wordcount")
def wordcount(value: Any) -> int:
    return textutil.count_words(to_text(value))


@register("escape")
def escape(value: Any) -> str:
    return html.escape(to_text(value))
