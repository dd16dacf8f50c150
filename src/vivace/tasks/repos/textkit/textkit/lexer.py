"""Splits template source into tokens, and tag contents into expression tokens.

Template tokens are text, variable tags (`{{ }}`), block tags (`{% %}`); comments (`{# #}`)
are dropped. Every token remembers the line it starts on so errors can name it. A `-` just
inside a delimiter strips the whitespace of the neighbouring text on that side.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .errors import TemplateSyntaxError

TEXT = "text"
VAR = "var"
BLOCK = "block"
COMMENT = "comment"

_OPENER = re.compile(r"\{([{%#])")
_CLOSERS = {"{": ("}}", VAR), "%": ("%}", BLOCK), "#": ("#}", COMMENT)}

_EXPR_TOKEN = re.compile(
    r"""
    (?P<ws>\s+)
  | (?P<number>\d+(?:\.\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|[<>|(),.\-])
    """,
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


@dataclass(frozen=True)
class Token:
    """A piece of template source: `kind` is TEXT, VAR or BLOCK; `value` is the tag content."""

    kind: str
    value: str
    lineno: int


@dataclass(frozen=True)
class ExprToken:
    """A piece of an expression: kind is name, number, string, op or end."""

    kind: str
    value: Any


def tokenize(source: str, name: str = "<template>") -> list[Token]:
    """The tokens of `source`, in order; raises TemplateSyntaxError on an unclosed tag."""
    tokens: list[Token] = []
    pos = 0
    lineno = 1
    strip_next = False
    while True:
        match = _OPENER.search(source, pos)
        end_of_text = len(source) if match is None else match.start()
        text = source[pos:end_of_text]
        text_line = lineno
        if strip_next:
            stripped = text.lstrip()
            text_line += text.count("\n", 0, len(text) - len(stripped))
            text = stripped
        if match is None:
            if text:
                tokens.append(Token(TEXT, text, text_line))
            return tokens
        tag_line = lineno + source.count("\n", pos, end_of_text)
        inner = match.end()
        if source.startswith("-", inner):
            text = text.rstrip()
            inner += 1
        if text:
            tokens.append(Token(TEXT, text, text_line))
        closer, kind = _CLOSERS[match.group(1)]
        end = source.find(closer, inner)
        if end == -1:
            raise TemplateSyntaxError(f"unclosed tag, expected {closer!r}", tag_line, name)
        content = source[inner:end]
        strip_next = content.endswith("-")
        if strip_next:
            content = content[:-1]
        if kind != COMMENT:
            tokens.append(Token(kind, content.strip(), tag_line))
        pos = end + len(closer)
        lineno = tag_line + source.count("\n", end_of_text, pos)


def tokenize_expression(text: str, lineno: int, name: str = "<template>") -> list[ExprToken]:
    """The tokens of an expression, ending with an `end` token."""
    tokens: list[ExprToken] = []
    pos = 0
    while pos < len(text):
        match = _EXPR_TOKEN.match(text, pos)
        if match is None:
            raise TemplateSyntaxError(f"unexpected character {text[pos]!r} in expression", lineno, name)
        kind, value = match.lastgroup, match.group()
        if kind == "number":
            tokens.append(ExprToken("number", float(value) if "." in value else int(value)))
        elif kind == "string":
            tokens.append(ExprToken("string", unescape(value[1:-1])))
        elif kind != "ws":
            tokens.append(ExprToken(str(kind), value))
        pos = match.end()
    tokens.append(ExprToken("end", None))
    return tokens


def unescape(body: str) -> str:
    """Resolves backslash escapes in a string literal's body; unknown escapes stay as written."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), body)
