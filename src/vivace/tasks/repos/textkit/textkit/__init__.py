"""textkit: a mini template language and text utilities."""

from .context import Context, Undefined
from .errors import FilterError, RenderError, TemplateError, TemplateSyntaxError, UndefinedError
from .filters import FilterRegistry, FilterSpec, default_filters
from .template import Template, render
from .text import count_words, fill, indent, normalize_whitespace, slugify, truncate, wrap

__all__ = [
    "Context",
    "FilterError",
    "FilterRegistry",
    "FilterSpec",
    "RenderError",
    "Template",
    "TemplateError",
    "TemplateSyntaxError",
    "Undefined",
    "UndefinedError",
    "count_words",
    "default_filters",
    "fill",
    "indent",
    "normalize_whitespace",
    "render",
    "slugify",
    "truncate",
    "wrap",
]
