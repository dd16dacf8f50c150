"""Where settings come from, and which source wins.

Each `Source` loads a `Layer`: flat values by dotted key, and for each key its origin
("app.conf:12", "env:APP_SERVER__PORT", "override", ...). `merge_layers` stacks
layers, later ones taking precedence. The usual order, lowest first, is: schema
defaults, files, environment variables, explicit overrides.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import keys as keymod
from .errors import ConfigError, ParseError, SourceError
from .parse import parse, parse_value


@dataclass
class Layer:
    """The settings of one source: `values` and `origins` by dotted key."""

    values: dict[str, Any] = field(default_factory=dict)
    origins: dict[str, str] = field(default_factory=dict)

    def set(self, key: str, value: Any, origin: str | None) -> None:
        """Sets `key`; an origin of None means "not known"."""
        self.values[key] = value
        if origin is None:
            self.origins.pop(key, None)
        else:
            self.origins[key] = origin


class Source(ABC):
    """A provider of settings; `name` appears in the origins it reports."""

    name: str

    @abstractmethod
    def load(self) -> Layer:
        """The settings this source provides now."""

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"


class MappingSource(Source):
    """Settings from a mapping, flat (dotted keys) or nested (sections as mappings)."""

    def __init__(self, values: Mapping[str, Any], name: str = "mapping") -> None:
        self.values = dict(values)
        self.name = name

    def load(self) -> Layer:
        layer = Layer()
        for key, value in keymod.flatten(self.values).items():
            if not keymod.is_key(key):
                raise ConfigError(f"{self.name}: invalid key {key!r}")
            layer.set(key, value, self.name)
        return layer


class TextSource(Source):
    """Settings from configuration text."""

    def __init__(self, text: str, name: str = "<string>") -> None:
        self.text = text
        self.name = name

    def read(self) -> str:
        return self.text

    def load(self) -> Layer:
        doc = parse(self.read(), self.name)
        layer = Layer()
        for key, value in doc.values.items():
            layer.set(key, value, doc.origin(key))
        return layer


class FileSource(TextSource):
    """Settings from a configuration file, read when loaded. A missing `optional` file
    provides no settings; a missing required one is a `SourceError`."""

    def __init__(self, path: str | Path, optional: bool = False) -> None:
        self.path = Path(path)
        self.optional = optional
        super().__init__("", str(path))

    def read(self) -> str:
        try:
            return self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            if self.optional:
                return ""
            raise SourceError(f"config file not found: {self.path}") from None
        except OSError as error:
            raise SourceError(f"cannot read {self.path}: {error.strerror}") from None


class EnvSource(Source):
    """Settings from environment variables named `prefix` + key, with sections joined by
    `separator` and names upper-cased: APP_SERVER__PORT is `server.port`, APP_DEBUG is
    `debug`. Values are text; a schema converts them. Variables whose rest is not a
    valid key are ignored.

    `env` is the mapping to read (the process environment when None).
    """

    def __init__(self, prefix: str, env: Mapping[str, str] | None = None, separator: str = "__") -> None:
        if not prefix:
            raise ConfigError("an environment source needs a prefix")
        self.prefix = prefix
        self.env = env
        self.separator = separator
        self.name = f"env:{prefix}*"

    def key_for(self, variable: str) -> str | None:
        """The key that `variable` sets, or None if it is not one of this source's."""
        if not variable.startswith(self.prefix):
            return None
        rest = variable[len(self.prefix) :]
        key = ".".join(rest.split(self.separator)).lower()
        return key if keymod.is_key(key) else None

    def variable_for(self, key: str) -> str:
        """The variable that sets `key`."""
        return self.prefix + self.separator.join(key.split(".")).upper()

    def load(self) -> Layer:
        env = os.environ if self.env is None else self.env
        layer = Layer()
        for variable in sorted(env):
            key = self.key_for(variable)
            if key is not None:
                layer.set(key, env[variable], f"env:{variable}")
        return layer


class OverrideSource(Source):
    """Settings given as "key=value" strings (say, from the command line); values are
    read like values in a file, so `port=8080` is an integer."""

    def __init__(self, assignments: Iterable[str], name: str = "override") -> None:
        self.assignments = list(assignments)
        self.name = name

    def load(self) -> Layer:
        layer = Layer()
        for number, assignment in enumerate(self.assignments, start=1):
            key, equals, text = assignment.partition("=")
            key = key.strip()
            if not equals:
                raise ParseError(f"expected key=value, got {assignment!r}", number, self.name)
            if not keymod.is_key(key):
                raise ParseError(f"invalid key {key!r}", number, self.name)
            layer.set(key, parse_value(text, number, self.name), self.name)
        return layer


def merge_layers(layers: Iterable[Layer]) -> Layer:
    """One layer from several, later layers taking precedence; keys keep the position
    where they first appeared."""
    merged = Layer()
    for layer in layers:
        for key, value in layer.values.items():
            merged.set(key, value, layer.origins.get(key))
    return merged
