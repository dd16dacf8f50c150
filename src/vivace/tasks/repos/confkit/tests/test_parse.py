import pytest

from confkit.errors import ParseError
from confkit.parse import Document, dumps, format_value, parse, parse_value, scalar

SAMPLE = """\
# an example
name = "demo"   ; trailing comment

[server]
host = localhost
port = 8080
ratio = 0.75
debug = false
timeout = 1h30m  # bare text

[server.tls]
cert = /etc/cert#1.pem
"""


def test_scalars():
    assert scalar("true") is True
    assert scalar("false") is False
    assert scalar("True") == "True"
    assert scalar("42") == 42
    assert scalar("-7") == -7
    assert scalar("+3") == 3
    assert scalar("1_000_000") == 1000000
    assert scalar("0.5") == 0.5
    assert scalar("-1.5e3") == -1500.0
    assert scalar("2e2") == 200.0
    assert isinstance(scalar("2e2"), float)
    assert scalar("1__0") == "1__0"
    assert scalar(".5") == ".5"
    assert scalar("1h") == "1h"


def test_parse_sections_and_types():
    doc = parse(SAMPLE, "app.conf")
    assert isinstance(doc, Document)
    assert doc.values == {
        "name": "demo",
        "server.host": "localhost",
        "server.port": 8080,
        "server.ratio": 0.75,
        "server.debug": False,
        "server.timeout": "1h30m",
        "server.tls.cert": "/etc/cert#1.pem",
    }
    assert list(doc.values) == list(doc.lines)
    assert doc.lines["name"] == 2
    assert doc.lines["server.port"] == 6
    assert doc.lines["server.tls.cert"] == 12
    assert doc.origin("server.host") == "app.conf:5"


def test_quoted_strings():
    assert parse_value(' "a \\"b\\" \\\\ c" ') == 'a "b" \\ c'
    assert parse_value('"tab\\there\\nnext\\r"') == "tab\there\nnext\r"
    assert parse_value("'raw \\n # kept'") == "raw \\n # kept"
    assert parse_value('"# not a comment" # a comment') == "# not a comment"
    assert parse_value('"42"') == "42"
    assert parse_value('""') == ""
    assert parse_value("''") == ""
    assert parse_value("") == ""
    assert parse_value("   ") == ""
    assert parse_value("hello world  ") == "hello world"
    assert parse_value("a;b") == "a;b"
    assert parse_value("a ;b") == "a"


def test_lists():
    assert parse_value("[]") == []
    assert parse_value("[1, 2, 3]") == [1, 2, 3]
    assert parse_value("[ a , 'b c', \"d,e\", true, 1.5 ]") == ["a", "b c", "d,e", True, 1.5]
    assert parse_value("[1, 2,]") == [1, 2]
    assert parse_value("[[1, 2], [], [x]]") == [[1, 2], [], ["x"]]
    assert parse_value("[1] # note") == [1]
    assert parse_value('[ "a" , \'b\' ,[ 1 ] ]') == ["a", "b", [1]]


PARSE_ERRORS = [
    ("a = 1\n[server\nb = 2", 2, "malformed section header"),
    ("[bad name]", 1, "invalid section name 'bad name'"),
    ("[a..b]", 1, "invalid section name"),
    ("\n\njust words", 3, "expected 'key = value' or '[section]'"),
    ("1x = 2", 1, "invalid key '1x'"),
    ("a = 1\nb = 2\na = 3", 3, "duplicate key 'a' (first set on line 1)"),
    ("[s]\na = 1\n[t]\n[s]", 4, "section [s] is already defined on line 1"),
    ('a = "open', 1, "unterminated string"),
    ("a = 'open", 1, "unterminated string"),
    ('a = "bad \\q"', 1, "unknown escape \\q"),
    ("x = 1\na = [1, 2", 2, "unterminated list"),
    ('a = ["x" "y"]', 1, "expected ',' or ']' in list"),
    ("a = [1,,2]", 1, "empty list item"),
    ('a = "x" y', 1, "unexpected text after value: 'y'"),
    ("a = 1\n[a]\nb = 2", 3, "'a' is both a value and a section"),
    ("[a]\nb = 1\n[]\nc = 2\nb = 3", 3, "invalid section name ''"),
]


def test_parse_errors_name_the_line():
    for text, line, message in PARSE_ERRORS:
        with pytest.raises(ParseError) as caught:
            parse(text, "f.conf")
        assert caught.value.line == line, text
        assert caught.value.source == "f.conf"
        assert message in caught.value.message, text
        assert str(caught.value).startswith(f"f.conf:{line}: ")


def test_parse_error_without_a_line():
    error = ParseError("broken", source="x.conf")
    assert error.line == 0
    assert str(error) == "x.conf: broken"
    assert str(ParseError("bad", 4)) == "<string>:4: bad"


def test_comments_blank_lines_and_dotted_keys():
    doc = parse("; header\n\n   # indented comment\n[a]\nb.c = 1\n  d=2  \n")
    assert doc.values == {"a.b.c": 1, "a.d": 2}
    assert doc.lines == {"a.b.c": 5, "a.d": 6}
    assert parse("").values == {}
    assert parse("[empty]\n").values == {}


def test_format_value():
    assert format_value(True) == "true"
    assert format_value(False) == "false"
    assert format_value(0) == "0"
    assert format_value(-12) == "-12"
    assert format_value(0.25) == "0.25"
    assert format_value("a\"b\\c\nd\te") == '"a\\"b\\\\c\\nd\\te"'
    assert format_value(["x", 1, [True]]) == '["x", 1, [true]]'
    assert format_value(("a",)) == '["a"]'
    with pytest.raises(ValueError):
        format_value(float("inf"))
    with pytest.raises(TypeError, match="dict"):
        format_value({"a": 1})


ROUND_TRIP = [True, False, 0, 17, -3, 1.5, 1e-05, 1e20, "", "plain", "42", "true", "a # b ; c", 'q"uote\\', "l\ni\tne\r", [], [1, "two", [3.0, False]]]


def test_values_round_trip():
    for value in ROUND_TRIP:
        text = format_value(value)
        assert parse_value(text) == value, text
        assert type(parse_value(text)) is type(value), text


def test_dumps_groups_sections():
    values = {"server.port": 80, "name": "x", "server.tls.cert": "c.pem", "server.host": "h", "debug": True}
    text = dumps(values)
    assert text == (
        'name = "x"\n'
        "debug = true\n"
        "\n"
        "[server]\n"
        "port = 80\n"
        'host = "h"\n'
        "\n"
        "[server.tls]\n"
        'cert = "c.pem"\n'
    )
    assert parse(text).values == values
    assert dumps({}) == ""
    assert dumps({"a.b": 1}) == "[a]\nb = 1\n"
