import pytest

from textkit import Template, TemplateSyntaxError
from textkit.nodes import BoolOp, Compare, FilterCall, For, If, Literal, Not, Output, Text, Variable
from textkit.parser import split_tag


def expr(source):
    node = Template("{{ " + source + " }}").nodes[0]
    assert isinstance(node, Output)
    return node.expr


def test_precedence_or_and_not():
    node = expr("a or b and not c")
    assert isinstance(node, BoolOp) and node.op == "or"
    assert isinstance(node.right, BoolOp) and node.right.op == "and"
    assert isinstance(node.right.right, Not)


def test_comparison_binds_tighter_than_and():
    node = expr("a < 1 and b in c")
    assert isinstance(node.left, Compare) and node.left.op == "<"
    assert isinstance(node.right, Compare) and node.right.op == "in"


def test_filters_chain_left_to_right():
    node = expr("name | trim | truncate(10, '..')")
    assert isinstance(node, FilterCall) and node.name == "truncate"
    assert [a.value for a in node.args] == [10, ".."]
    assert node.expr.name == "trim" and node.expr.expr == Variable(("name",), 1)


def test_literals_and_paths():
    assert expr("true") == Literal(True)
    assert expr("none") == Literal(None)
    assert expr("-3") == Literal(-3)
    assert expr("rows.0.name") == Variable(("rows", "0", "name"), 1)
    assert expr("(1)") == Literal(1)


def test_block_structure():
    source = "x{% if a %}1{% elif b %}2{% else %}3{% endif %}{% for i in s %}{{ i }}{% else %}-{% endfor %}"
    nodes = Template(source).nodes
    assert isinstance(nodes[0], Text)
    assert isinstance(nodes[1], If) and len(nodes[1].branches) == 2 and nodes[1].else_body == [Text("3")]
    assert isinstance(nodes[2], For) and nodes[2].targets == ("i",) and nodes[2].else_body == [Text("-")]


def test_for_with_two_targets():
    node = Template("{% for k, v in d %}{% endfor %}").nodes[0]
    assert node.targets == ("k", "v")


def test_split_tag():
    assert split_tag("if  a and b ") == ("if", "a and b")
    assert split_tag("endif") == ("endif", "")
    assert split_tag("") == ("", "")


@pytest.mark.parametrize(
    ("source", "line", "message"),
    [
        ("{{ }}", 1, "empty expression"),
        ("{{ a b }}", 1, "unexpected 'b' after expression"),
        ("\n{{ a | }}", 2, "expected a filter name"),
        ("{{ a | nope }}", 1, "unknown filter 'nope'"),
        ("{{ a | upper(1) }}", 1, "filter 'upper' takes 0 arguments, got 1"),
        ("{{ a | default }}", 1, "filter 'default' takes 1 to 2 arguments, got 0"),
        ("{{ a | replace('x') }}", 1, "takes 2 to 3 arguments, got 1"),
        ("{{ (a }}", 1, "expected ')', found end of expression"),
        ("{{ a. }}", 1, "expected an attribute name"),
        ("{{ - a }}", 1, "expected a number after '-'"),
        ("{{ and }}", 1, "unexpected keyword 'and'"),
        ("{{ a == }}", 1, "unexpected end of expression"),
        ("{{ ) }}", 1, "unexpected ')'"),
        ("a\n\n{% frobnicate %}", 3, "unknown tag 'frobnicate'"),
        ("{% %}", 1, "empty block tag"),
        ("\n{% endif %}", 2, "unexpected 'endif' outside"),
        ("x\n{% if a %}\n\nno end", 2, "'if' block is never closed (expected 'endif')"),
        ("{% for x in y %}{% if x %}{% endfor %}", 1, "unexpected 'endfor'"),
        ("{% for x in y %}\n", 1, "'for' block is never closed (expected 'endfor')"),
        ("{% if a %}{% else %}{% else %}{% endif %}", 1, "unexpected 'else'"),
        ("{% if a %}\n{% else b %}{% endif %}", 2, "'else' takes no arguments"),
        ("{% if a %}{% endif a %}", 1, "'endif' takes no arguments"),
        ("{% for x of y %}{% endfor %}", 1, "invalid for loop"),
        ("{% for in in y %}{% endfor %}", 1, "cannot assign to 'in'"),
        ("{% if %}{% endif %}", 1, "empty expression"),
        ("{% if a %}\n{% elif %}{% endif %}", 2, "empty expression"),
    ],
)
def test_syntax_errors_name_the_line(source, line, message):
    with pytest.raises(TemplateSyntaxError) as info:
        Template(source, name="t.txt")
    assert info.value.lineno == line
    assert message in info.value.message
    assert str(info.value) == f"t.txt, line {line}: {info.value.message}"
