"""`Config`: the settings an application runs with.

`Config.load` stacks sources (lowest precedence first), resolves `${...}` references and,
given a schema, fills in defaults and converts every value to its field's type:

    config = Config.load(
        [FileSource("app.conf"), EnvSource("APP_", env), OverrideSource(["server.port=9000"])],
        schema,
    )
    config["server.port"]              # 9000
    config.origin("server.port")       # "override"
    config.section("server")["port"]   # 9000
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import keys as keymod
from .errors import MissingKeyError, ValidationError
from .interpolate import interpolate
from .parse import dumps
from .schema import MISSING, Schema, make_field
from .sources import EnvSource, FileSource, Layer, MappingSource, OverrideSource, Source, TextSource, merge_layers


class Config:
    """Settings by dotted key, with where each came from and, optionally, their schema.

    A Config is not changed once made: `merge` returns a new one.
    """

    def __init__(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        schema: Schema | None = None,
        origins: Mapping[str, str] | None = None,
    ) -> None:
        self._values = dict(values or {})
        keymod.check_conflicts(self._values)
        self.schema = schema
        origins = origins or {}
        self._origins = {key: origins[key] for key in self._values if key in origins}

    @classmethod
    def load(
        cls,
        sources: Iterable[Source],
        schema: Schema | None = None,
        *,
        strict: bool = False,
        resolve: bool = True,
    ) -> Config:
        """Settings from `sources`, later ones taking precedence over earlier ones and all
        over the schema's defaults. With `strict`, settings the schema does not know are
        errors; with `resolve` False, `${...}` references are left as they are."""
        layers: list[Layer] = []
        if schema is not None:
            layers.append(MappingSource(schema.defaults(), "default").load())
        layers.extend(source.load() for source in sources)
        merged = merge_layers(layers)
        values = interpolate(merged.values) if resolve else merged.values
        if schema is not None:
            values = schema.validate(values, merged.origins, strict=strict)
        return cls(values, schema=schema, origins=merged.origins)

    @classmethod
    def from_text(cls, text: str, schema: Schema | None = None, *, source: str = "<string>", strict: bool = False) -> Config:
        """Settings from configuration text alone (and the schema's defaults)."""
        return cls.load([TextSource(text, source)], schema, strict=strict)

    def get(self, key: str, default: Any = MISSING) -> Any:
        """The value of `key`; `default` if it is not set, or `MissingKeyError` without one."""
        if key in self._values:
            return self._values[key]
        if default is MISSING:
            raise MissingKeyError(key)
        return default

    def __getitem__(self, key: str) -> Any:
        return self.get(key)

    def get_as(self, key: str, type_name: str, **options: Any) -> Any:
        """The value of `key` cleaned by a field of the registered type `type_name`
        (with `options`), for settings a schema does not cover:
        `config.get_as("cache.ttl", "duration")`."""
        field = make_field({"type": type_name, **options})
        try:
            return field.clean(self[key])
        except ValidationError as error:
            raise ValidationError(error.message, key, self._origins.get(key)) from None

    def origin(self, key: str) -> str | None:
        """Where the value of `key` came from ("app.conf:3", "env:APP_PORT", "default", ...),
        or None if not known."""
        if key not in self._values:
            raise MissingKeyError(key)
        return self._origins.get(key)

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._values)

    def items(self) -> list[tuple[str, Any]]:
        return list(self._values.items())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Config):
            return NotImplemented
        return self._values == other._values

    def __repr__(self) -> str:
        return f"Config({self._values!r})"

    def sections(self) -> list[str]:
        """Every section holding settings, nested ones included, sorted."""
        names = set()
        for key in self._values:
            section = keymod.split(key)[0]
            while section:
                names.add(section)
                section = keymod.split(section)[0]
        return sorted(names)

    def section(self, name: str) -> Config:
        """The settings inside section `name`, with keys relative to it."""
        inside = [key for key in self._values if keymod.is_within(key, name)]
        if not inside:
            raise MissingKeyError(name)
        start = len(name) + 1
        values = {key[start:]: self._values[key] for key in inside}
        origins = {key[start:]: self._origins[key] for key in inside if key in self._origins}
        schema = None if self.schema is None else self.schema.section(name)
        return Config(values, schema=schema, origins=origins)

    def merge(self, other: Config | Mapping[str, Any], origin: str = "merge") -> Config:
        """A new Config with the settings of `other` (a Config, or a flat or nested mapping
        whose settings come from `origin`) replacing these. The result has this Config's
        schema, or else `other`'s, and is validated by it."""
        if isinstance(other, Config):
            layer = Layer(dict(other._values), dict(other._origins))
            schema = self.schema if self.schema is not None else other.schema
        else:
            layer = MappingSource(other, origin).load()
            schema = self.schema
        merged = merge_layers([Layer(dict(self._values), dict(self._origins)), layer])
        values = merged.values
        if schema is not None:
            values = schema.validate(values, merged.origins)
        return Config(values, schema=schema, origins=merged.origins)

    def as_dict(self) -> dict[str, Any]:
        """The settings as nested dictionaries, one per section."""
        return keymod.nest(self._values)

    def dumps(self) -> str:
        """The settings in the text format; typed values are written as their fields write
        them (a duration as "1h30m"), so that loading the text with the same schema gives
        an equal Config."""
        if self.schema is None:
            return dumps(self._values)
        return dumps({key: self.schema.format(key, value) for key, value in self._values.items()})


def load_config(
    *,
    schema: Schema | None = None,
    files: Iterable[str | Path] = (),
    env: Mapping[str, str] | None = None,
    env_prefix: str | None = None,
    overrides: Sequence[str] = (),
    strict: bool = False,
) -> Config:
    """The usual stack: schema defaults, then `files` in order, then environment variables
    starting with `env_prefix` (when given; from `env`, or the process environment), then
    "key=value" `overrides`."""
    sources: list[Source] = [FileSource(path) for path in files]
    if env_prefix is not None:
        sources.append(EnvSource(env_prefix, env))
    if overrides:
        sources.append(OverrideSource(overrides))
    return Config.load(sources, schema, strict=strict)
