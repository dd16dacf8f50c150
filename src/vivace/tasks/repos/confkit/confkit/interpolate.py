"""`${...}` references between settings.

    [server]
    host = example.org
    port = 8080
    url = "http://${server.host}:${.port}/"   # ${.name}: a key of the same section

A value that is exactly one reference takes the referenced value with its type
(`limit = ${defaults.limit}` stays an integer); references inside longer text are
inserted as text. `$$` stands for a literal `$`. References are followed through any
number of settings; a cycle is a `CycleError`, anything else unresolvable an
`InterpolationError`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from . import keys as keymod
from .errors import CycleError, InterpolationError

_REFERENCE_RE = re.compile(r"\$(\$|\{([^}]*)\})")


def interpolate(values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` with every reference replaced; the mapping given is not changed."""
    resolver = _Resolver(values)
    return {key: resolver.resolve(key) for key in values}


def _as_text(key: str, reference: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int, float)):
        return str(value)
    raise InterpolationError(key, f"cannot insert ${{{reference}}} ({type(value).__name__}) into text")


class _Resolver:
    """Resolves keys on demand, remembering results and the chain being resolved."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        self.values = values
        self.resolved: dict[str, Any] = {}
        self.chain: list[str] = []

    def resolve(self, key: str) -> Any:
        if key in self.resolved:
            return self.resolved[key]
        if key in self.chain:
            raise CycleError(self.chain[self.chain.index(key) :] + [key])
        self.chain.append(key)
        try:
            value = self.expand(key, self.values[key])
        finally:
            self.chain.pop()
        self.resolved[key] = value
        return value

    def expand(self, key: str, value: Any) -> Any:
        if isinstance(value, str):
            return self.expand_text(key, value)
        if isinstance(value, list):
            return [self.expand(key, item) for item in value]
        return value

    def expand_text(self, key: str, text: str) -> Any:
        whole = _REFERENCE_RE.fullmatch(text)
        if whole is not None and whole.group(2) is not None:
            return self.lookup(key, whole.group(2))
        parts: list[str] = []
        pos = 0
        for match in _REFERENCE_RE.finditer(text):
            parts.append(text[pos : match.start()])
            if match.group(2) is None:
                parts.append("$")
            else:
                parts.append(_as_text(key, match.group(2), self.lookup(key, match.group(2))))
            pos = match.end()
        rest = text[pos:]
        if "${" in rest:
            raise InterpolationError(key, f"unterminated reference in {text!r}")
        parts.append(rest)
        return "".join(parts)

    def lookup(self, key: str, reference: str) -> Any:
        """The resolved value that `reference` (seen in the value of `key`) names."""
        name = reference.strip()
        if name.startswith("."):
            name = keymod.join(keymod.split(key)[0], name[1:])
        if not keymod.is_key(name):
            raise InterpolationError(key, f"bad reference ${{{reference}}}")
        if name not in self.values:
            raise InterpolationError(key, f"unknown setting {name!r} in ${{{reference}}}")
        return self.resolve(name)
