"""Files to chunks: functions, classes and methods where a tree-sitter grammar exists, line
windows elsewhere.

Syntax-aware chunks keep a definition whole when it fits (MAX_CHARS), merge small siblings
(imports, constants, short functions) up to that limit, and split a large definition into
its members (a class into methods, a long function into runs of statements), carrying the
small header (signature, decorators) into its first piece. Every line of a file belongs to
exactly one chunk: comments and blank lines go with the code that follows them. Each chunk
names the definitions it holds (`Class.method`; the first MAX_SYMBOLS), or the one it sits inside.

Not guaranteed: that a chunk stays under MAX_CHARS (one long line, or a header merged into a
first piece, may exceed it), or meaningful chunks for files that barely parse (tree-sitter
recovers from errors; the result is still a cover of the file's lines).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from vivace.search.languages import Language, language_of, parser_for

MAX_CHARS = 1_200  # a chunk's size limit: about what the default embedder reads (256 word pieces)
MAX_DEPTH = 40  # syntax levels descended into when splitting
WINDOW_LINES = 40  # line windows (no grammar, or an unsplittable node) stop at this many lines
MAX_TEXT = 20_000  # characters of one chunk that are indexed (a minified line is cut here)
MAX_SYMBOLS = 50  # names kept per chunk: a minified line may define thousands; the embedder reads the first 12
_WRAPPERS = ("decorated_definition", "export_statement")
_DEF = re.compile(
    r"^\s*(?:export\s+)?(?:pub(?:\([\w:]+\))?\s+)?(?:async\s+)?"
    r"(?:def|class|function|func|fn|struct|interface|enum|trait|module|sub|proc)\s+([A-Za-z_]\w*)"
)


@dataclass(frozen=True)
class Chunk:
    path: str
    start: int  # 1-based first line
    end: int  # 1-based last line, inclusive
    text: str  # the lines start..end (cut at MAX_TEXT characters)
    symbols: tuple[str, ...] = ()  # definitions inside, qualified ("Cart.add"); else the enclosing one

    @property
    def symbol(self) -> str | None:
        return self.symbols[0] if self.symbols else None


@dataclass
class _Span:
    start: int  # 0-based rows, inclusive
    end: int
    size: int  # bytes of source
    symbols: list[str]


def chunk_file(path: str, text: str) -> list[Chunk]:
    """The chunks of one file's text (empty for an empty file)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if not lines:
        return []
    lang = language_of(path)
    parser = parser_for(lang.name) if lang else None
    spans: list[_Span] = []
    if parser is not None and lang is not None:
        source = text.encode("utf-8", "surrogatepass")
        spans = _Splitter(lang, source, lines).group(parser.parse(source).root_node.children, [])
    spans = _cover(spans, len(lines)) if spans else _windows(lines, 0, len(lines) - 1, [], regex=True)
    chunks = []
    for s in spans:
        text = "\n".join(lines[s.start : s.end + 1])[:MAX_TEXT]
        chunks.append(Chunk(path, s.start + 1, s.end + 1, text, tuple(s.symbols[:MAX_SYMBOLS])))
    return chunks


class _Splitter:
    def __init__(self, lang: Language, source: bytes, lines: list[str]):
        self.lang, self.source, self.lines = lang, source, lines

    def group(self, nodes: list[Any], scope: list[str], depth: int = 0) -> list[_Span]:
        """Sibling nodes as spans: small ones merged up to MAX_CHARS, large ones split."""
        out: list[_Span] = []
        cur: _Span | None = None
        for node in nodes:
            start, end = node.start_point.row, _end_row(node)
            size = node.end_byte - node.start_byte
            name = self.name(node)
            names = [".".join([*scope, name])] if name else []
            if size > MAX_CHARS:
                wrapper = node.type in _WRAPPERS  # the definition inside names itself
                inner = self.split(node, [*scope, name] if name and not wrapper else scope, depth + 1)
                if cur is not None and inner and cur.size < MAX_CHARS // 4:  # a small header joins its body
                    inner[0] = _Span(cur.start, inner[0].end, cur.size + inner[0].size, cur.symbols + inner[0].symbols)
                elif cur is not None:
                    out.append(cur)
                cur = None
                if inner and names and not wrapper and names[0] not in inner[0].symbols:
                    inner[0].symbols.insert(0, names[0])
                out += inner
            elif cur is not None and cur.size + size <= MAX_CHARS:
                cur = _Span(cur.start, max(cur.end, end), cur.size + size, cur.symbols + names)
            else:
                if cur is not None:
                    out.append(cur)
                cur = _Span(start, end, size, names)
        if cur is not None:
            out.append(cur)
        for span in out:
            if not span.symbols and scope:
                span.symbols = [".".join(scope)]
        return out

    def split(self, node: Any, scope: list[str], depth: int) -> list[_Span]:
        """A node too large for one chunk: its children grouped, or line windows for a leaf (or
        past MAX_DEPTH: deeply nested expressions are not worth a deeper look, nor a stack overflow)."""
        children = node.children
        single = len(children) == 1 and children[0].end_byte - children[0].start_byte >= MAX_CHARS
        if depth < MAX_DEPTH and single and children[0].children:
            return self.split(children[0], scope, depth + 1)
        if depth >= MAX_DEPTH or not children or single:
            return _windows(self.lines, node.start_point.row, _end_row(node), [".".join(scope)] if scope else [])
        return self.group(children, scope, depth)

    def name(self, node: Any) -> str | None:
        """The name a definition node introduces (None for other nodes)."""
        kind = node.type
        if kind in _WRAPPERS:
            inner = node.child_by_field_name("definition") or node.child_by_field_name("declaration")
            return self.name(inner) if inner is not None else None
        if kind not in self.lang.definitions:
            return None
        if kind in ("lexical_declaration", "variable_declaration", "type_declaration"):
            spec = next((c for c in node.named_children if c.type in ("variable_declarator", "type_spec")), None)
            return self._text(spec.child_by_field_name("name")) if spec is not None else None
        for field in ("name", "type"):
            got = node.child_by_field_name(field)
            if got is not None:
                return self._text(got)
        return None

    def _text(self, node: Any) -> str | None:
        if node is None:
            return None
        return self.source[node.start_byte : node.end_byte].decode("utf-8", "replace")[:200] or None


def _end_row(node: Any) -> int:
    """The last row a node has text on (a node ending at column 0 ends on the row before)."""
    row, col = node.end_point.row, node.end_point.column
    return row - 1 if col == 0 and row > node.start_point.row else row


def _cover(spans: list[_Span], n_lines: int) -> list[_Span]:
    """Spans made contiguous over all lines: gaps (comments, blank lines) join the next span,
    rows shared by two spans stay with the first, the tail joins the last."""
    out: list[_Span] = []
    names: set[str] = set()  # out[-1]'s symbols: thousands of spans may merge into one (a minified line)
    for span in sorted(spans, key=lambda s: s.start):
        start = out[-1].end + 1 if out else 0
        if span.end < start:  # entirely inside the previous span's rows
            kept = out[-1].symbols
            for name in span.symbols:
                if len(kept) >= MAX_SYMBOLS:
                    break
                if name not in names:
                    names.add(name)
                    kept.append(name)
            continue
        out.append(_Span(start, span.end, span.size, span.symbols[:MAX_SYMBOLS]))
        names = set(out[-1].symbols)
    out[-1].end = n_lines - 1
    return out


def _windows(lines: list[str], first: int, last: int, symbols: list[str], regex: bool = False) -> list[_Span]:
    """Rows first..last as windows of at most WINDOW_LINES lines and about MAX_CHARS characters.
    With `regex`, a window is named after the definitions a line pattern finds (no grammar)."""
    out, start, size = [], first, 0
    enclosing = list(symbols)
    for row in range(first, last + 1):
        size += len(lines[row]) + 1
        if row == last or row - start + 1 >= WINDOW_LINES or size + len(lines[row + 1]) > MAX_CHARS:
            names = list(symbols)
            if regex:
                found = [m.group(1) for r in range(start, row + 1) if (m := _DEF.match(lines[r]))]
                names = found or enclosing
                enclosing = found[-1:] or enclosing
            out.append(_Span(start, row, size, names))
            start, size = row + 1, 0
    return out
