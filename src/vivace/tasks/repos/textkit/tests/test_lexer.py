import pytest

from textkit.errors import TemplateSyntaxError
from textkit.lexer import BLOCK, TEXT, VAR, Token, tokenize, tokenize_expression, unescape


def test_text_only():
    assert tokenize("plain text") == [Token(TEXT, "plain text", 1)]
    assert tokenize("") == []


def test_variable_and_block_tokens():
    tokens = tokenize("a {{ name }} b {% if x %}c{% endif %}")
    assert [(t.kind, t.value) for t in tokens] == [
        (TEXT, "a "),
        (VAR, "name"),
        (TEXT, " b "),
        (BLOCK, "if x"),
        (TEXT, "c"),
        (BLOCK, "endif"),
    ]


def test_comments_are_dropped():
    tokens = tokenize("a{# note {{ x }} #}b")
    assert [(t.kind, t.value) for t in tokens] == [(TEXT, "a"), (TEXT, "b")]


def test_line_numbers():
    tokens = tokenize("one\ntwo {{ a }}\n\n{% if b %}\n{{ c }}{% endif %}")
    lines = {t.value: t.lineno for t in tokens if t.kind != TEXT}
    assert lines == {"a": 2, "if b": 4, "c": 5, "endif": 5}
    assert tokens[0].lineno == 1


def test_line_numbers_count_newlines_inside_tags():
    tokens = tokenize("{#\n\n#}{{\nx\n}}{{ y }}")
    assert [(t.value, t.lineno) for t in tokens] == [("x", 3), ("y", 5)]


def test_whitespace_control():
    tokens = tokenize("a  \n {{- x -}} \n b")
    assert [t.value for t in tokens] == ["a", "x", "b"]
    assert tokens[2].lineno == 3


def test_stripped_text_starts_on_its_first_kept_line():
    tokens = tokenize("{{ x -}}\n\n  a\nb {{ y }}")
    assert [(t.value, t.lineno) for t in tokens] == [("x", 1), ("a\nb ", 3), ("y", 4)]


def test_whitespace_control_only_on_marked_side():
    tokens = tokenize("a {{- x }} b {%- if y %} c")
    assert [t.value for t in tokens] == ["a", "x", " b", "if y", " c"]


@pytest.mark.parametrize(
    ("source", "line"), [("{{ x", 1), ("a\nb {% if", 2), ("\n\n{# never", 3), ("{{ a }}\n{{ b %}", 2)]
)
def test_unclosed_tag_names_its_line(source, line):
    with pytest.raises(TemplateSyntaxError) as info:
        tokenize(source, name="page.html")
    assert info.value.lineno == line
    assert "unclosed tag" in str(info.value)
    assert str(info.value).startswith(f"page.html, line {line}:")


def test_expression_tokens():
    tokens = tokenize_expression("user.age >= 18 | round(1) != 'x'", 1)
    assert [(t.kind, t.value) for t in tokens] == [
        ("name", "user"),
        ("op", "."),
        ("name", "age"),
        ("op", ">="),
        ("number", 18),
        ("op", "|"),
        ("name", "round"),
        ("op", "("),
        ("number", 1),
        ("op", ")"),
        ("op", "!="),
        ("string", "x"),
        ("end", None),
    ]


def test_expression_numbers_and_strings():
    tokens = tokenize_expression(r'2.5 "a \"b\"\n" ' + "'it\\'s'", 1)
    assert tokens[0].value == 2.5 and isinstance(tokens[0].value, float)
    assert tokens[1].value == 'a "b"\n'
    assert tokens[2].value == "it's"


def test_expression_bad_character():
    with pytest.raises(TemplateSyntaxError, match="unexpected character '@'") as info:
        tokenize_expression("a @ b", 7)
    assert info.value.lineno == 7


def test_unescape_keeps_unknown_escapes():
    assert unescape(r"a\qb\\c\td") == "a\\qb\\c\td"
