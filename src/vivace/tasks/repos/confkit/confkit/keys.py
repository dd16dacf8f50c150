"""Dotted keys: "server.tls.cert" is the key `cert` of the section `server.tls`.

Settings are kept flat, as a mapping from dotted keys to values; `nest` and `flatten`
convert to and from nested dictionaries.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .errors import KeyConflictError

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def is_name(text: str) -> bool:
    """Whether `text` is a valid single key name (no dots)."""
    return NAME_RE.fullmatch(text) is not None


def is_key(text: str) -> bool:
    """Whether `text` is a valid dotted key: names joined by single dots."""
    return all(is_name(part) for part in text.split("."))


def join(section: str, name: str) -> str:
    """The key `name` inside `section` ("" is the top level)."""
    return f"{section}.{name}" if section else name


def split(key: str) -> tuple[str, str]:
    """`(section, name)` of a dotted key; the section of a top-level key is ""."""
    section, _, name = key.rpartition(".")
    return section, name


def is_within(key: str, section: str) -> bool:
    """Whether `key` lies inside `section`, at any depth."""
    return key.startswith(section + ".")


def check_conflicts(keys: Iterable[str]) -> None:
    """Raises `KeyConflictError` if one key is a section of another."""
    keys = list(keys)
    sections: dict[str, str] = {}
    for key in keys:
        parts = key.split(".")
        for end in range(1, len(parts)):
            sections.setdefault(".".join(parts[:end]), key)
    for key in sorted(keys):
        if key in sections:
            raise KeyConflictError(key, sections[key])


def flatten(nested: Mapping[str, Any], section: str = "") -> dict[str, Any]:
    """Dotted keys of a nested mapping; an empty nested mapping contributes no keys."""
    flat: dict[str, Any] = {}
    for name, value in nested.items():
        key = join(section, name)
        if isinstance(value, Mapping):
            flat.update(flatten(value, key))
        else:
            flat[key] = value
    return flat


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The nested form of a flat mapping (the inverse of `flatten`)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *sections, name = key.split(".")
        node = nested
        for part in sections:
            node = node.setdefault(part, {})
        node[name] = value
    return nested
