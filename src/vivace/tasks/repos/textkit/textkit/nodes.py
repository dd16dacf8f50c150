"""The syntax tree: expressions evaluate to values, statements render into an output list."""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .context import Context, Undefined
from .errors import FilterError, RenderError, UndefinedError
from .filters import FilterRegistry, to_text

COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "==": operator.eq,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "in": lambda a, b: a in b,
}


@dataclass
class RenderState:
    """What rendering needs besides the scope: filters, strictness, the template's name."""

    filters: FilterRegistry
    strict: bool = False
    name: str = "<template>"


class Expr:
    """An expression node."""

    def evaluate(self, ctx: Context, state: RenderState) -> Any:
        raise NotImplementedError


@dataclass
class Literal(Expr):
    value: Any

    def evaluate(self, ctx: Context, state: RenderState) -> Any:
        return self.value


@dataclass
class Variable(Expr):
    path: tuple[str, ...]
    lineno: int

    @property
    def dotted(self) -> str:
        return ".".join(self.path)

    def lookup(self, ctx: Context) -> Any:
        """The value, or Undefined; never raises, whatever the strictness."""
        return ctx.resolve(self.path)

    def evaluate(self, ctx: Context, state: RenderState) -> Any:
        value = self.lookup(ctx)
        if state.strict and isinstance(value, Undefined):
            raise UndefinedError(f"{value.name!r} is undefined", self.lineno, state.name)
        return value


@dataclass
class FilterCall(Expr):
    expr: Expr
    name: str
    args: list[Expr]
    lineno: int

    def evaluate(self, ctx: Context, state: RenderState) -> Any:
        spec = state.filters.get(self.name)
        if spec.handles_undefined and isinstance(self.expr, Variable):
            value = self.expr.lookup(ctx)
        else:
            value = self.expr.evaluate(ctx, state)
        args = [arg.evaluate(ctx, state) for arg in self.args]
        try:
            return spec.func(value, *args)
        except FilterError as e:
            raise FilterError(e.message, self.lineno, state.name) from None
        except (TypeError, ValueError) as e:
            raise FilterError(f"filter {self.name!r} failed: {e}", self.lineno, state.name) from None


@dataclass
class Compare(Expr):
    left: Expr
    op: str
    right: Expr
    lineno: int

    def evaluate(self, ctx: Context, state: RenderState) -> Any:
        left = self.left.evaluate(ctx, state)
        right = self.right.evaluate(ctx, state)
        try:
            return COMPARISONS[self.op](left, right)
        except TypeError:
            raise RenderError(
                f"cannot compare {type(left).__name__} {self.op} {type(right).__name__}", self.lineno, state.name
            ) from None


@dataclass
class Not(Expr):
    expr: Expr

    def evaluate(self, ctx: Context, state: RenderState) -> Any:
        return not self.expr.evaluate(ctx, state)


@dataclass
class BoolOp(Expr):
    """`and` / `or` with Python semantics: the deciding operand is the result."""

    op: str
    left: Expr
    right: Expr

    def evaluate(self, ctx: Context, state: RenderState) -> Any:
        left = self.left.evaluate(ctx, state)
        if self.op == "and":
            return self.right.evaluate(ctx, state) if left else left
        return left if left else self.right.evaluate(ctx, state)


class Node:
    """A statement node."""

    def render(self, ctx: Context, state: RenderState, out: list[str]) -> None:
        raise NotImplementedError


def render_body(body: Iterable[Node], ctx: Context, state: RenderState, out: list[str]) -> None:
    for node in body:
        node.render(ctx, state, out)


@dataclass
class Text(Node):
    text: str

    def render(self, ctx: Context, state: RenderState, out: list[str]) -> None:
        out.append(self.text)


@dataclass
class Output(Node):
    expr: Expr
    lineno: int

    def render(self, ctx: Context, state: RenderState, out: list[str]) -> None:
        out.append(to_text(self.expr.evaluate(ctx, state)))


@dataclass
class If(Node):
    branches: list[tuple[Expr, list[Node]]]
    else_body: list[Node] = field(default_factory=list)
    lineno: int = 0

    def render(self, ctx: Context, state: RenderState, out: list[str]) -> None:
        for condition, body in self.branches:
            if condition.evaluate(ctx, state):
                render_body(body, ctx, state, out)
                return
        render_body(self.else_body, ctx, state, out)


@dataclass
class For(Node):
    targets: tuple[str, ...]
    iterable: Expr
    body: list[Node]
    else_body: list[Node] = field(default_factory=list)
    lineno: int = 0

    def items(self, ctx: Context, state: RenderState) -> list[Any]:
        """The values to loop over: a mapping gives its keys, or its items for `for k, v`."""
        value = self.iterable.evaluate(ctx, state)
        if value is None or isinstance(value, Undefined):
            return []
        if isinstance(value, Mapping):
            return list(value.items()) if len(self.targets) == 2 else list(value)
        if isinstance(value, str) or not isinstance(value, Iterable):
            raise RenderError(f"cannot loop over {type(value).__name__}", self.lineno, state.name)
        return list(value)

    def bind(self, scope: Context, item: Any, state: RenderState) -> None:
        """Binds the loop target(s) to one item in the loop's scope."""
        if len(self.targets) == 1:
            scope.set(self.targets[0], item)
            return
        try:
            first, second = item
        except (TypeError, ValueError):
            raise RenderError(
                f"cannot unpack {item!r} into {', '.join(self.targets)}", self.lineno, state.name
            ) from None
        scope.set(self.targets[0], first)
        scope.set(self.targets[1], second)

    def render(self, ctx: Context, state: RenderState, out: list[str]) -> None:
        items = self.items(ctx, state)
        if not items:
            render_body(self.else_body, ctx, state, out)
            return
        for item in items:
            scope = ctx.push()
            self.bind(scope, item, state)
            render_body(self.body, scope, state, out)
