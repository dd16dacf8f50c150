"""Layered, typed application configuration: a small INI-like text format, field types
with defaults and validation, environment variables and overrides, `${...}` references."""

from .config import Config, load_config
from .errors import (
    ConfigError,
    CycleError,
    InterpolationError,
    KeyConflictError,
    MissingKeyError,
    ParseError,
    SchemaError,
    SourceError,
    ValidationError,
)
from .interpolate import interpolate
from .parse import Document, dumps, format_value, parse, parse_value
from .schema import MISSING, Field, Schema, field_type, field_type_names, make_field, register_field
from .sources import EnvSource, FileSource, Layer, MappingSource, OverrideSource, Source, TextSource, merge_layers

__all__ = [
    "MISSING",
    "Config",
    "ConfigError",
    "CycleError",
    "Document",
    "EnvSource",
    "Field",
    "FileSource",
    "InterpolationError",
    "KeyConflictError",
    "Layer",
    "MappingSource",
    "MissingKeyError",
    "OverrideSource",
    "ParseError",
    "Schema",
    "SchemaError",
    "Source",
    "SourceError",
    "TextSource",
    "ValidationError",
    "dumps",
    "field_type",
    "field_type_names",
    "format_value",
    "interpolate",
    "load_config",
    "make_field",
    "merge_layers",
    "parse",
    "parse_value",
    "register_field",
]
