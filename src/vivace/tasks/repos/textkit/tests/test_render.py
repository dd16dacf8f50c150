from dataclasses import dataclass

import pytest

from textkit import Context, RenderError, Template, UndefinedError, default_filters, render
from textkit.errors import FilterError


@dataclass
class User:
    name: str
    age: int
    _secret: str = "s"


def test_variables_and_attributes():
    assert render("Hi {{ user.name }} ({{ user.age }})", user=User("Ann", 31)) == "Hi Ann (31)"
    assert render("{{ d.k }}/{{ rows.1 }}/{{ rows.2 }}", d={"k": "v"}, rows=["a", "b"]) == "v/b/"


def test_private_attributes_are_not_visible():
    assert render("[{{ u._secret }}]", u=User("a", 1)) == "[]"


def test_values_print_template_style():
    assert render("{{ a }}|{{ b }}|{{ c }}|{{ d }}", a=None, b=True, c=False, d=1.5) == "|true|false|1.5"


def test_missing_variable_is_empty_when_lenient():
    assert render("[{{ missing }}][{{ a.b.c }}]", a={"b": {}}) == "[][]"


def test_strict_mode_raises_naming_the_variable():
    template = Template("ok\n{{ a.b.c }}", strict=True, name="s.txt")
    with pytest.raises(UndefinedError) as info:
        template.render(a={"b": {}})
    assert info.value.lineno == 2
    assert "'a.b.c' is undefined" in str(info.value)
    assert template.render(a={"b": {"c": 3}}) == "ok\n3"


def test_strict_mode_lets_default_see_undefined():
    template = Template("{{ nick | default('anon') }}", strict=True)
    assert template.render() == "anon"
    assert template.render(nick="bo") == "bo"


def test_if_elif_else():
    template = Template("{% if n > 10 %}big{% elif n >= 5 %}mid{% elif n == 0 %}zero{% else %}small{% endif %}")
    assert [template.render(n=n) for n in (11, 10, 5, 4, 0)] == ["big", "mid", "mid", "small", "zero"]


def test_comparisons():
    template = Template(
        "{{ a < b }} {{ a <= b }} {{ a > b }} {{ a >= b }} {{ a == b }} {{ a != b }} {{ a in c }}"
    )
    assert template.render(a=2, b=2, c=[1, 2]) == "false true false true true false true"
    assert template.render(a=1, b=2, c=[]) == "true true false false false true false"
    assert template.render(a=3, b=2, c=[3]) == "false false true true false true true"


def test_boolean_operators_return_the_deciding_operand():
    assert render("{{ name or 'anonymous' }}", name="") == "anonymous"
    assert render("{{ name or 'anonymous' }}", name="Zoe") == "Zoe"
    assert render("{{ a and b }}", a="x", b="y") == "y"
    assert render("{{ a and b }}", a=0, b="y") == "0"
    assert render("{{ not a }}", a=[]) == "true"
    assert render("{% if not (a or b) %}none{% endif %}", a=0, b=0) == "none"


def test_and_short_circuits_in_strict_mode():
    template = Template("{% if x and x.y %}yes{% else %}no{% endif %}", strict=True)
    assert template.render(x=0) == "no"
    assert template.render(x={"y": 1}) == "yes"


def test_for_loop_and_else():
    template = Template("{% for i in items %}<{{ i }}>{% else %}empty{% endfor %}")
    assert template.render(items=[1, 2, 3]) == "<1><2><3>"
    assert template.render(items=[]) == "empty"
    assert template.render() == "empty"
    assert template.render(items=None) == "empty"


def test_for_over_mapping():
    d = {"b": 2, "a": 1}
    assert render("{% for k in d %}{{ k }};{% endfor %}", d=d) == "b;a;"
    assert render("{% for k, v in d %}{{ k }}={{ v }};{% endfor %}", d=d) == "b=2;a=1;"
    assert render("{% for x, y in pairs %}{{ y }}{{ x }}{% endfor %}", pairs=[(1, 2), (3, 4)]) == "2143"


def test_loop_variables_do_not_leak_and_shadow_outer_names():
    template = Template("{{ x }}{% for x in xs %}[{{ x }}]{% endfor %}{{ x }}")
    assert template.render(x="o", xs=[1, 2]) == "o[1][2]o"


def test_nested_loops():
    template = Template("{% for row in rows %}{% for c in row %}{{ c }}{% endfor %}|{% endfor %}")
    assert template.render(rows=[[1, 2], [], [3]]) == "12||3|"


def test_loop_errors():
    with pytest.raises(RenderError, match="cannot loop over int") as info:
        Template("\n{% for i in n %}{% endfor %}").render(n=5)
    assert info.value.lineno == 2
    with pytest.raises(RenderError, match="cannot loop over str"):
        render("{% for c in s %}{% endfor %}", s="abc")
    with pytest.raises(RenderError, match="cannot unpack 3"):
        render("{% for a, b in xs %}{% endfor %}", xs=[3])


def test_comparison_type_error_is_a_render_error():
    with pytest.raises(RenderError, match="cannot compare str < int") as info:
        Template("x\n\n{{ a < 1 }}").render(a="s")
    assert info.value.lineno == 3


def test_filter_errors_carry_the_line():
    with pytest.raises(FilterError, match="join: expected a list") as info:
        Template("a\n{{ n | join(',') }}").render(n=3)
    assert info.value.lineno == 2


def test_filter_type_errors_are_wrapped():
    registry = default_filters.child()

    @registry.register("half")
    def half(value):
        return value / 2

    template = Template("{{ x | half }}", filters=registry)
    assert template.render(x=3) == "1.5"
    with pytest.raises(FilterError, match="filter 'half' failed") as info:
        template.render(x="a")
    assert info.value.lineno == 1


def test_custom_registry_does_not_change_the_default():
    registry = default_filters.child()
    registry.register("shout")(lambda v: str(v).upper() + "!")
    assert Template("{{ 'hi' | shout }}", filters=registry).render() == "HI!"
    assert "shout" not in default_filters


def test_render_accepts_a_context_and_layers_keywords():
    ctx = Context({"a": 1, "b": 2})
    template = Template("{{ a }}{{ b }}")
    assert template.render(ctx) == "12"
    assert template.render(ctx, b=3) == "13"
    assert template.render({"a": "x"}, a="y") == "y"


def test_whitespace_control_in_rendering():
    source = "<ul>\n  {%- for i in xs %}\n  <li>{{ i }}</li>\n  {%- endfor %}\n</ul>"
    assert render(source, xs=[1, 2]) == "<ul>\n  <li>1</li>\n  <li>2</li>\n</ul>"
