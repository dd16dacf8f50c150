"""The public entry point: compile a template once, render it with different contexts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .context import Context
from .filters import FilterRegistry, default_filters
from .lexer import tokenize
from .nodes import Node, RenderState, render_body
from .parser import Parser


class Template:
    """A compiled template.

    `filters` defaults to the built-in registry (extend it with `default_filters.child()`).
    With `strict`, using an undefined variable raises UndefinedError instead of printing
    nothing (the `default` filter still sees it).
    """

    def __init__(
        self,
        source: str,
        *,
        name: str = "<template>",
        filters: FilterRegistry | None = None,
        strict: bool = False,
    ) -> None:
        self.source = source
        self.name = name
        self.filters = default_filters if filters is None else filters
        self.strict = strict
        self.nodes: list[Node] = Parser(tokenize(source, name), filters=self.filters, name=name).parse()

    def render(self, context: Mapping[str, Any] | Context | None = None, /, **values: Any) -> str:
        """Renders against `context` (a mapping or a Context), with `values` layered on top."""
        ctx = context if isinstance(context, Context) else Context(context)
        if values:
            ctx = ctx.push(values)
        out: list[str] = []
        render_body(self.nodes, ctx, RenderState(self.filters, self.strict, self.name), out)
        return "".join(out)


def render(source: str, context: Mapping[str, Any] | None = None, /, **values: Any) -> str:
    """Compiles and renders `source` in one go."""
    return Template(source).render(context, **values)
