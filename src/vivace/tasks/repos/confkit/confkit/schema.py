"""Typed settings: field types and the `Schema` that checks a whole configuration.

A `Field` turns a raw value (from a file, where it may already be typed, or from the
environment, where it is always a string) into the setting's value with `clean`, and
back into something the text format can write with `format`. Field types are
registered by name with `@register_field`, so a schema can be written as data:

    Schema.from_spec({
        "server.port": {"type": "int", "min": 1, "max": 65535, "default": 8080},
        "server.timeout": {"type": "duration", "default": "30s"},
        "log.level": {"type": "choice", "choices": ["debug", "info", "error"]},
        "name": "str",
    })
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from datetime import timedelta
from typing import Any, ClassVar

from . import keys as keymod
from .errors import ConfigError, SchemaError, ValidationError
from .parse import scalar


class _Missing:
    """The marker for "no value"; there is one instance, `MISSING`."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()

_FIELD_TYPES: dict[str, type[Field]] = {}


def register_field(cls: type[Field]) -> type[Field]:
    """Class decorator: makes the field type available under `cls.type_name`."""
    if cls.type_name in _FIELD_TYPES:
        raise ValueError(f"field type {cls.type_name!r} is already registered")
    _FIELD_TYPES[cls.type_name] = cls
    return cls


def field_type(name: str) -> type[Field]:
    """The field class registered as `name`."""
    try:
        return _FIELD_TYPES[name]
    except KeyError:
        known = ", ".join(field_type_names())
        raise ConfigError(f"unknown field type {name!r} (known: {known})") from None


def field_type_names() -> list[str]:
    return sorted(_FIELD_TYPES)


def make_field(spec: str | Mapping[str, Any]) -> Field:
    """A field from its spec: a type name, or a mapping with "type" and the field's options."""
    if isinstance(spec, str):
        spec = {"type": spec}
    options = dict(spec)
    if "type" not in options:
        raise ConfigError(f"field spec without a type: {dict(spec)!r}")
    cls = field_type(options.pop("type"))
    try:
        return cls(**options)
    except TypeError as error:
        raise ConfigError(f"bad options for a {cls.type_name} field: {error}") from None


def _describe(raw: Any) -> str:
    return f"{type(raw).__name__} {raw!r}"


class Field(ABC):
    """One setting's type, default and constraints.

    `required` settings must be given; others fall back to `default`, and a setting
    with neither is simply absent. Subclasses implement `convert` and may extend
    `check` (constraints on the converted value) and `format`.
    """

    type_name: ClassVar[str]

    def __init__(self, *, default: Any = MISSING, required: bool = False, help: str = "") -> None:
        if required and default is not MISSING:
            raise ConfigError("a required field cannot have a default")
        self.default = default
        self.required = required
        self.help = help

    @abstractmethod
    def convert(self, raw: Any) -> Any:
        """The typed value of `raw`; raises `ValidationError` if it has the wrong type."""

    def check(self, value: Any) -> None:
        """Raises `ValidationError` if the converted `value` breaks a constraint."""

    def clean(self, raw: Any) -> Any:
        """`raw` converted and checked."""
        value = self.convert(raw)
        self.check(value)
        return value

    def format(self, value: Any) -> Any:
        """`value` as the text format can write it (bool, int, float, str or list)."""
        return value

    def __repr__(self) -> str:
        return f"<{self.type_name} field>"


class _Bounded(Field):
    """A field whose values are ordered, with optional inclusive `min` and `max`."""

    def __init__(self, *, min: Any = None, max: Any = None, **options: Any) -> None:
        super().__init__(**options)
        self.min = None if min is None else self.convert(min)
        self.max = None if max is None else self.convert(max)
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ConfigError(f"{self.type_name} field: min is greater than max")

    def check(self, value: Any) -> None:
        if self.min is not None and value < self.min:
            raise ValidationError(f"must be at least {self.format(self.min)}, got {self.format(value)}")
        if self.max is not None and value > self.max:
            raise ValidationError(f"must be at most {self.format(self.max)}, got {self.format(value)}")


@register_field
class StrField(Field):
    """Text; numbers and booleans are accepted as their text. `pattern` must match it all."""

    type_name = "str"

    def __init__(self, *, pattern: str | None = None, **options: Any) -> None:
        super().__init__(**options)
        self.pattern = None if pattern is None else re.compile(pattern)

    def convert(self, raw: Any) -> str:
        if isinstance(raw, bool):
            return "true" if raw else "false"
        if isinstance(raw, (str, int, float)):
            return str(raw)
        raise ValidationError(f"expected text, got {_describe(raw)}")

    def check(self, value: str) -> None:
        if self.pattern is not None and not self.pattern.fullmatch(value):
            raise ValidationError(f"{value!r} does not match {self.pattern.pattern!r}")


@register_field
class IntField(_Bounded):
    type_name = "int"

    def convert(self, raw: Any) -> int:
        if isinstance(raw, str):
            raw = scalar(raw.strip())
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ValidationError(f"expected an integer, got {_describe(raw)}")
        return raw


@register_field
class FloatField(_Bounded):
    type_name = "float"

    def convert(self, raw: Any) -> float:
        if isinstance(raw, str):
            raw = scalar(raw.strip())
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise ValidationError(f"expected a number, got {_describe(raw)}")
        return float(raw)


@register_field
class BoolField(Field):
    """true/false; from text also yes/no, on/off and 1/0, in any case."""

    type_name = "bool"
    TRUE_WORDS = frozenset({"true", "yes", "on", "1"})
    FALSE_WORDS = frozenset({"false", "no", "off", "0"})

    def convert(self, raw: Any) -> bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str):
            word = raw.strip().lower()
            if word in self.TRUE_WORDS:
                return True
            if word in self.FALSE_WORDS:
                return False
        raise ValidationError(f"expected true or false, got {_describe(raw)}")


@register_field
class ChoiceField(Field):
    """One of a fixed set of words."""

    type_name = "choice"

    def __init__(self, *, choices: list[str], **options: Any) -> None:
        if not choices:
            raise ConfigError("a choice field needs at least one choice")
        self.choices = tuple(choices)
        super().__init__(**options)

    def convert(self, raw: Any) -> str:
        if not isinstance(raw, str):
            raise ValidationError(f"expected one of {', '.join(self.choices)}, got {_describe(raw)}")
        return raw.strip()

    def check(self, value: str) -> None:
        if value not in self.choices:
            raise ValidationError(f"expected one of {', '.join(self.choices)}, got {value!r}")


@register_field
class ListField(Field):
    """A list whose items are all of the `item` field type (a spec, default "str").

    From text (an environment variable) the items are separated by `separator`.
    """

    type_name = "list"

    def __init__(
        self,
        *,
        item: str | Mapping[str, Any] = "str",
        separator: str = ",",
        min_items: int = 0,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.item = make_field(item)
        self.separator = separator
        self.min_items = min_items

    def convert(self, raw: Any) -> list[Any]:
        if isinstance(raw, str):
            raw = [part.strip() for part in raw.split(self.separator)] if raw.strip() else []
        if not isinstance(raw, (list, tuple)):
            raise ValidationError(f"expected a list, got {_describe(raw)}")
        items = []
        for index, item in enumerate(raw):
            try:
                items.append(self.item.clean(item))
            except ValidationError as error:
                raise ValidationError(f"item {index}: {error.message}") from None
        return items

    def check(self, value: list[Any]) -> None:
        if len(value) < self.min_items:
            raise ValidationError(f"expected at least {self.min_items} items, got {len(value)}")

    def format(self, value: list[Any]) -> list[Any]:
        return [self.item.format(item) for item in value]


_DURATION_UNITS = {"d": 86400_000, "h": 3600_000, "m": 60_000, "s": 1000, "ms": 1}
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")


@register_field
class DurationField(_Bounded):
    """A length of time, such as "1h30m", "90s", "2d" or "250ms" (units d, h, m, s, ms),
    or a number of seconds; the value is a `timedelta`."""

    type_name = "duration"

    def convert(self, raw: Any) -> timedelta:
        if isinstance(raw, timedelta):
            return raw
        if isinstance(raw, (int, float)) and not isinstance(raw, bool):
            return timedelta(seconds=raw)
        if isinstance(raw, str):
            return parse_duration(raw)
        raise ValidationError(f"expected a duration, got {_describe(raw)}")

    def check(self, value: timedelta) -> None:
        if value < timedelta(0):
            raise ValidationError("a duration cannot be negative")
        super().check(value)

    def format(self, value: timedelta) -> str:
        return format_duration(value)


def parse_duration(text: str) -> timedelta:
    """`timedelta` of "1h30m"-style text; a plain number is seconds."""
    text = text.strip().replace(" ", "")
    if not text:
        raise ValidationError("expected a duration, got an empty text")
    number = scalar(text)
    if isinstance(number, (int, float)) and not isinstance(number, bool):
        return timedelta(seconds=number)
    total = 0.0
    pos = 0
    for match in _DURATION_RE.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text):
        raise ValidationError(f"bad duration {text!r} (use units d, h, m, s, ms as in '1h30m')")
    return timedelta(milliseconds=total)


def format_duration(value: timedelta) -> str:
    """"1h30m"-style text of a whole number of milliseconds ("0s" for zero)."""
    remaining = round(value / timedelta(milliseconds=1))
    if remaining == 0:
        return "0s"
    sign = "-" if remaining < 0 else ""
    remaining = abs(remaining)
    parts = []
    for unit, size in _DURATION_UNITS.items():
        count, remaining = divmod(remaining, size)
        if count:
            parts.append(f"{count}{unit}")
    return sign + "".join(parts)


class Schema:
    """The fields of a configuration, by dotted key."""

    def __init__(self, fields: Mapping[str, Field] | None = None) -> None:
        self._fields: dict[str, Field] = {}
        for key, field in (fields or {}).items():
            self.add(key, field)

    @classmethod
    def from_spec(cls, spec: Mapping[str, str | Mapping[str, Any]]) -> Schema:
        """A schema from field specs by key (see `make_field`); nested mappings without
        a "type" are sections."""
        schema = cls()
        for key, field_spec in _spec_items(spec, ""):
            schema.add(key, make_field(field_spec))
        return schema

    def add(self, key: str, field: Field) -> None:
        if not keymod.is_key(key):
            raise ConfigError(f"invalid key {key!r}")
        if key in self._fields:
            raise ConfigError(f"field {key!r} is already defined")
        keymod.check_conflicts([*self._fields, key])
        self._fields[key] = field

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __getitem__(self, key: str) -> Field:
        return self._fields[key]

    def __len__(self) -> int:
        return len(self._fields)

    def keys(self) -> list[str]:
        return list(self._fields)

    def get(self, key: str) -> Field | None:
        return self._fields.get(key)

    def section(self, name: str) -> Schema:
        """The fields inside section `name`, with their keys relative to it."""
        prefix = name + "."
        return Schema({key[len(prefix) :]: f for key, f in self._fields.items() if key.startswith(prefix)})

    def defaults(self) -> dict[str, Any]:
        """The default of every field that has one."""
        return {key: f.default for key, f in self._fields.items() if f.default is not MISSING}

    def format(self, key: str, value: Any) -> Any:
        """`value` of `key` as the text format writes it (unchanged for keys without a field)."""
        field = self._fields.get(key)
        return value if field is None else field.format(value)

    def validate(
        self,
        values: Mapping[str, Any],
        origins: Mapping[str, str] | None = None,
        *,
        strict: bool = False,
    ) -> dict[str, Any]:
        """The cleaned values, in the order given. All problems, missing required
        settings included, are reported together in a `SchemaError`, by key. Keys
        without a field are kept as they are, or with `strict` rejected."""
        origins = origins or {}
        cleaned: dict[str, Any] = {}
        errors: list[ValidationError] = []
        for key in [*values, *(key for key in self._fields if key not in values)]:
            field = self._fields.get(key)
            if key not in values:
                if field is not None and field.required:
                    errors.append(ValidationError("is required", key))
                continue
            if field is None:
                if strict:
                    errors.append(ValidationError("unknown setting", key, origins.get(key)))
                else:
                    cleaned[key] = values[key]
                continue
            try:
                cleaned[key] = field.clean(values[key])
            except ValidationError as error:
                errors.append(ValidationError(error.message, key, origins.get(key)))
        if errors:
            raise SchemaError(sorted(errors, key=lambda error: error.key or ""))
        return cleaned


def _spec_items(spec: Mapping[str, Any], section: str):
    for name, value in spec.items():
        key = keymod.join(section, name)
        if isinstance(value, Mapping) and "type" not in value:
            yield from _spec_items(value, key)
        else:
            yield key, value
