"""String utilities shared by the filters and usable on their own."""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"[a-z0-9]+")


def normalize_whitespace(text: str) -> str:
    """Collapses every run of whitespace to one space and trims the ends."""
    return " ".join(text.split())


def wrap(text: str, width: int, *, break_long_words: bool = True) -> list[str]:
    """Greedy word wrap: lines of at most `width` characters, words separated by one space.

    A word longer than `width` is split into `width`-sized pieces, unless `break_long_words`
    is false, in which case it gets a line of its own.
    """
    if width < 1:
        raise ValueError(f"width must be at least 1, got {width}")
    lines: list[str] = []
    current = ""
    for word in text.split():
        while break_long_words and len(word) > width:
            if current:
                lines.append(current)
                current = ""
            lines.append(word[:width])
            word = word[width:]
        if not current:
            current = word
        elif len(current) + 1 + len(word) <= width:
            current = current + " " + word
        else:
            lines.append(current)
            current = word
    if current:
        lines.append(current)
    return lines


def fill(text: str, width: int, *, break_long_words: bool = True) -> str:
    """`wrap` joined with newlines."""
    return "\n".join(wrap(text, width, break_long_words=break_long_words))


def truncate(text: str, length: int, suffix: str = "...", *, whole_words: bool = False) -> str:
    """`text` cut to at most `length` characters, `suffix` included, when it is longer.

    With `whole_words`, the cut moves back to the last space so no word is split
    (unless the first word alone is too long).
    """
    if length < len(suffix):
        raise ValueError(f"length {length} is shorter than the suffix {suffix!r}")
    if len(text) <= length:
        return text
    keep = length - len(suffix)
    cut = text[:keep]
    if whole_words and text[keep] != " ":
        space = cut.rfind(" ")
        if space > 0:
            cut = cut[:space]
    return cut.rstrip() + suffix


def slugify(text: str, sep: str = "-", max_length: int | None = None) -> str:
    """A URL-friendly form: ASCII lowercase words joined by `sep`.

    Accents are folded ("Crème" -> "creme"); with `max_length`, whole words are dropped from
    the end until it fits (a single over-long word is cut).
    """
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = ""
    for word in _WORD.findall(folded.lower()):
        candidate = word if not slug else slug + sep + word
        if max_length is not None and len(candidate) > max_length:
            if not slug:
                slug = word[:max_length]
            break
        slug = candidate
    return slug


def indent(text: str, width: int = 4, *, first: bool = False) -> str:
    """Indents every non-blank line by `width` spaces; the first line only when `first`."""
    pad = " " * width
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        if line.strip() and (i > 0 or first):
            out.append(pad + line)
        else:
            out.append(line)
    return "\n".join(out)


def count_words(text: str) -> int:
    """The number of whitespace-separated words."""
    return len(text.split())
