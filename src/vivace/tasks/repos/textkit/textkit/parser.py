"""Builds the syntax tree from tokens; every syntax error names the offending line."""

from __future__ import annotations

import re
from collections.abc import Callable

from .errors import TemplateSyntaxError
from .filters import FilterRegistry
from .lexer import TEXT, VAR, ExprToken, Token, tokenize_expression
from .nodes import COMPARISONS, BoolOp, Compare, Expr, FilterCall, For, If, Literal, Node, Not, Output, Text, Variable

KEYWORD_LITERALS = {"true": True, "false": False, "none": None}
RESERVED = {"and", "or", "not", "in"}
END_TAGS = {"elif", "else", "endif", "endfor"}

_FOR_HEADER = re.compile(r"^([A-Za-z_]\w*)(?:\s*,\s*([A-Za-z_]\w*))?\s+in\s+(.+)$", re.DOTALL)


class ExpressionParser:
    """Recursive descent over one expression's tokens.

    Precedence, loosest first: `or`, `and`, `not`, comparison, filter (`|`), primary.
    """

    def __init__(self, text: str, lineno: int, filters: FilterRegistry, name: str = "<template>") -> None:
        self.lineno = lineno
        self.name = name
        self.filters = filters
        if not text.strip():
            raise self.error("empty expression")
        self.tokens = tokenize_expression(text, lineno, name)
        self.pos = 0

    def error(self, message: str) -> TemplateSyntaxError:
        return TemplateSyntaxError(message, self.lineno, self.name)

    def parse(self) -> Expr:
        node = self._or()
        tok = self._peek()
        if tok.kind != "end":
            raise self.error(f"unexpected {tok.value!r} after expression")
        return node

    def _peek(self) -> ExprToken:
        return self.tokens[self.pos]

    def _next(self) -> ExprToken:
        tok = self.tokens[self.pos]
        if tok.kind != "end":
            self.pos += 1
        return tok

    def _accept(self, kind: str, value: str) -> bool:
        tok = self._peek()
        if tok.kind == kind and tok.value == value:
            self.pos += 1
            return True
        return False

    def _expect(self, kind: str, value: str) -> None:
        if not self._accept(kind, value):
            found = self._peek()
            shown = "end of expression" if found.kind == "end" else repr(found.value)
            raise self.error(f"expected {value!r}, found {shown}")

    def _or(self) -> Expr:
        node = self._and()
        while self._accept("name", "or"):
            node = BoolOp("or", node, self._and())
        return node

    def _and(self) -> Expr:
        node = self._not()
        while self._accept("name", "and"):
            node = BoolOp("and", node, self._not())
        return node

    def _not(self) -> Expr:
        if self._accept("name", "not"):
            return Not(self._not())
        return self._comparison()

    def _comparison(self) -> Expr:
        left = self._filtered()
        tok = self._peek()
        if (tok.kind == "op" and tok.value in COMPARISONS) or (tok.kind == "name" and tok.value == "in"):
            self.pos += 1
            return Compare(left, tok.value, self._filtered(), self.lineno)
        return left

    def _filtered(self) -> Expr:
        node = self._primary()
        while self._accept("op", "|"):
            tok = self._next()
            if tok.kind != "name":
                raise self.error("expected a filter name after '|'")
            args: list[Expr] = []
            if self._accept("op", "("):
                if not self._accept("op", ")"):
                    args.append(self._or())
                    while self._accept("op", ","):
                        args.append(self._or())
                    self._expect("op", ")")
            try:
                spec = self.filters.get(tok.value)
            except KeyError:
                raise self.error(f"unknown filter {tok.value!r}") from None
            problem = spec.arity_error(len(args))
            if problem:
                raise self.error(problem)
            node = FilterCall(node, spec.name, args, self.lineno)
        return node

    def _primary(self) -> Expr:
        tok = self._next()
        if tok.kind in ("number", "string"):
            return Literal(tok.value)
        if tok.kind == "op" and tok.value == "-":
            number = self._next()
            if number.kind != "number":
                raise self.error("expected a number after '-'")
            return Literal(-number.value)
        if tok.kind == "op" and tok.value == "(":
            node = self._or()
            self._expect("op", ")")
            return node
        if tok.kind == "name":
            if tok.value in KEYWORD_LITERALS:
                return Literal(KEYWORD_LITERALS[tok.value])
            if tok.value in RESERVED:
                raise self.error(f"unexpected keyword {tok.value!r}")
            path = [tok.value]
            while self._accept("op", "."):
                part = self._next()
                if part.kind == "name" or (part.kind == "number" and isinstance(part.value, int)):
                    path.append(str(part.value))
                else:
                    raise self.error("expected an attribute name after '.'")
            return Variable(tuple(path), self.lineno)
        if tok.kind == "end":
            raise self.error("unexpected end of expression")
        raise self.error(f"unexpected {tok.value!r}")


class Parser:
    """Turns a token list into a list of statement nodes.

    Block tags are dispatched through `self.tags` (tag word -> handler); each handler gets
    the rest of the tag and the tag's token, and returns a node.
    """

    def __init__(self, tokens: list[Token], *, filters: FilterRegistry, name: str = "<template>") -> None:
        self.tokens = tokens
        self.filters = filters
        self.name = name
        self.pos = 0
        self.tags: dict[str, Callable[[str, Token], Node]] = {"if": self._parse_if, "for": self._parse_for}

    def error(self, message: str, lineno: int) -> TemplateSyntaxError:
        return TemplateSyntaxError(message, lineno, self.name)

    def expression(self, text: str, lineno: int) -> Expr:
        return ExpressionParser(text, lineno, self.filters, self.name).parse()

    def parse(self) -> list[Node]:
        body, _, _, _ = self._parse_body((), None)
        return body

    def _parse_body(self, end_tags: tuple[str, ...], opener: Token | None) -> tuple[list[Node], str, str, Token | None]:
        """Nodes up to one of `end_tags`: (nodes, the end tag's word, its rest, its token)."""
        nodes: list[Node] = []
        while self.pos < len(self.tokens):
            tok = self.tokens[self.pos]
            self.pos += 1
            if tok.kind == TEXT:
                nodes.append(Text(tok.value))
                continue
            if tok.kind == VAR:
                nodes.append(Output(self.expression(tok.value, tok.lineno), tok.lineno))
                continue
            word, rest = split_tag(tok.value)
            if word in end_tags:
                return nodes, word, rest, tok
            if word in self.tags:
                nodes.append(self.tags[word](rest, tok))
            elif word in END_TAGS:
                raise self.error(f"unexpected {word!r} outside of a matching block", tok.lineno)
            elif not word:
                raise self.error("empty block tag", tok.lineno)
            else:
                raise self.error(f"unknown tag {word!r}", tok.lineno)
        if opener is not None:
            word, _ = split_tag(opener.value)
            raise self.error(f"{word!r} block is never closed (expected {end_tags[-1]!r})", opener.lineno)
        return nodes, "", "", None

    def _no_arguments(self, word: str, rest: str, tok: Token | None) -> None:
        if rest and tok is not None:
            raise self.error(f"{word!r} takes no arguments", tok.lineno)

    def _parse_if(self, rest: str, tok: Token) -> Node:
        condition = self.expression(rest, tok.lineno)
        branches: list[tuple[Expr, list[Node]]] = []
        while True:
            body, word, tail, end = self._parse_body(("elif", "else", "endif"), tok)
            branches.append((condition, body))
            if word == "elif":
                condition = self.expression(tail, end.lineno if end else tok.lineno)
                continue
            if word == "else":
                self._no_arguments(word, tail, end)
                else_body, word, tail, end = self._parse_body(("endif",), tok)
                self._no_arguments(word, tail, end)
                return If(branches, else_body, tok.lineno)
            self._no_arguments(word, tail, end)
            return If(branches, [], tok.lineno)

    def _parse_for(self, rest: str, tok: Token) -> Node:
        match = _FOR_HEADER.match(rest)
        if match is None:
            raise self.error("invalid for loop, expected 'for <name> in <expression>'", tok.lineno)
        first, second, source = match.groups()
        targets = (first,) if second is None else (first, second)
        for target in targets:
            if target in RESERVED or target in KEYWORD_LITERALS:
                raise self.error(f"cannot assign to {target!r}", tok.lineno)
        iterable = self.expression(source, tok.lineno)
        body, word, tail, end = self._parse_body(("else", "endfor"), tok)
        else_body: list[Node] = []
        if word == "else":
            self._no_arguments(word, tail, end)
            else_body, word, tail, end = self._parse_body(("endfor",), tok)
        self._no_arguments(word, tail, end)
        return For(targets, iterable, body, else_body, tok.lineno)


def split_tag(content: str) -> tuple[str, str]:
    """A block tag's first word and the rest, both stripped."""
    parts = content.split(None, 1)
    if not parts:
        return "", ""
    return parts[0], parts[1].strip() if len(parts) > 1 else ""
