"""Exception types raised while compiling and rendering templates."""

from __future__ import annotations


class TemplateError(Exception):
    """Base class of every error textkit raises for a template."""

    def __init__(self, message: str, lineno: int | None = None, name: str = "<template>") -> None:
        self.message = message
        self.lineno = lineno
        self.name = name
        super().__init__(self._describe())

    def _describe(self) -> str:
        if self.lineno is None:
            return self.message
        return f"{self.name}, line {self.lineno}: {self.message}"


class TemplateSyntaxError(TemplateError):
    """The template source is malformed (unclosed tag, unknown filter, bad expression...)."""


class UndefinedError(TemplateError):
    """A strict template used a variable that the context does not define."""


class RenderError(TemplateError):
    """Rendering failed on a well-formed template (bad comparison, non-iterable loop...)."""


class FilterError(RenderError):
    """A filter rejected its input or its arguments."""
