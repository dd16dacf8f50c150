import pytest

from textkit import Context, RenderError, Template, TemplateSyntaxError, UndefinedError, render


def test_set_binds_a_name_for_the_rest_of_the_template():
    assert render("[{{ x }}]{% set x = 5 %}[{{ x }}]") == "[][5]"
    assert render("{{ x }}{% set x = 'new' %}{{ x }}", x="old") == "oldnew"
    assert render("{% set x = 1 %}{% set x = 2 %}{{ x }}") == "2"
    assert render("{% set x=3 %}{{ x }}") == "3"
    assert render("{% set a = 'A' %}{% set b = a %}{{ b }}{{ a }}") == "AA"


def test_set_evaluates_full_expressions():
    user = {"name": "ann lee", "age": 31}
    assert render("{% set name = user.name | title %}{{ name }}!", user=user) == "Ann Lee!"
    assert render("{% set nick = user.nick | default('anon') | upper %}{{ nick }}", user=user) == "ANON"
    assert render("{% set adult = user.age >= 18 %}{{ adult }}", user=user) == "true"
    assert render("{% set same = a == b %}{{ same }}", a=1, b=1) == "true"
    assert render("{% set same = a == b %}{{ same }}", a=1, b=2) == "false"
    assert render("{% set who = name or 'nobody' %}{{ who }}", name="") == "nobody"
    assert render("{% set n = -4 %}{% set nothing = none %}{{ n }}[{{ nothing }}]") == "-4[]"
    assert render("{% set n = n | int %}{{ n > 9 }}", n="10") == "true"


def test_set_values_keep_their_type():
    source = "{% set names = users | sort %}{% for u in names %}{{ u }};{% endfor %}{{ names | length }}"
    assert render(source, users=["cy", "al", "bo"]) == "al;bo;cy;3"
    assert render("{% set first = rows.0 %}{{ first.id }}", rows=[{"id": 7}]) == "7"


def test_set_inside_if_is_visible_after_the_block():
    template = Template("{% if big %}{% set size = 'L' %}{% else %}{% set size = 'S' %}{% endif %}<{{ size }}>")
    assert template.render(big=True) == "<L>"
    assert template.render(big=False) == "<S>"
    assert render("{% if false %}{% set x = 1 %}{% endif %}[{{ x }}]") == "[]"


def test_set_inside_a_loop_stays_in_the_loop():
    assert render("{% for i in xs %}{% set d = i %}[{{ d }}]{% endfor %}({{ d }})", xs=[1, 2]) == "[1][2]()"
    source = "{% set x = 'out' %}{% for i in xs %}{% set x = i %}{{ x }}{% endfor %}{{ x }}"
    assert render(source, xs=[1, 2]) == "12out"
    assert render("{% for i in xs %}{{ i }}{% set i = 'z' %}{{ i }}{% endfor %}", xs=[1, 2]) == "1z2z"


def test_each_loop_iteration_starts_afresh():
    source = "{% for i in xs %}<{{ seen }}>{% set seen = i %}{% endfor %}"
    assert render(source, xs=[1, 2, 3]) == "<><><>"
    assert render(source, xs=[1, 2], seen="o") == "<o><o>"


def test_set_in_nested_loops():
    source = (
        "{% for row in rows %}{% set label = 'row' %}"
        "{% for c in row %}{% set label = c %}{{ label }}{% endfor %}"
        "={{ label }};{% endfor %}"
    )
    assert render(source, rows=[["a", "b"], [], ["c"]]) == "ab=row;=row;c=row;"


def test_set_with_whitespace_control():
    source = "{%- set title = page.title | default('home') | title -%}\n<h1>{{ title }}</h1>\n"
    assert render(source, page={}) == "<h1>Home</h1>\n"
    assert render(source, page={"title": "about us"}) == "<h1>About Us</h1>\n"


def test_set_does_not_change_the_callers_data():
    data = {"a": 1}
    template = Template("{% set a = 2 %}{% set b = 3 %}{{ a }}{{ b }}")
    assert template.render(data) == "23"
    assert data == {"a": 1}
    ctx = Context({"a": 1})
    assert template.render(ctx) == "23"
    assert ctx.lookup("a") == 1
    assert "b" not in ctx
    assert ctx.flatten() == {"a": 1}
    assert template.render(ctx, a=5) == "23"
    assert ctx.flatten() == {"a": 1}


def test_rendering_again_starts_from_the_callers_data():
    template = Template("{{ n }}{% set n = 'x' %}{{ n }}")
    ctx = Context({"n": 1})
    assert template.render(ctx) == "1x"
    assert template.render(ctx) == "1x"
    assert template.render() == "x"
    assert template.render(n=0) == "0x"


def test_set_in_strict_mode():
    template = Template("{% set x = 1 %}{{ x }}", strict=True)
    assert template.render() == "1"
    assert Template("{% set nick = nick | default('anon') %}{{ nick }}", strict=True).render() == "anon"
    with pytest.raises(UndefinedError) as info:
        Template("ok\n{% set x = missing.value %}{{ x }}", strict=True, name="s.txt").render()
    assert info.value.lineno == 2
    assert "'missing' is undefined" in str(info.value)


def test_render_errors_in_set_carry_the_line():
    with pytest.raises(RenderError, match="cannot compare str < int") as info:
        Template("a\n\n{% set ok = a < 1 %}").render(a="s")
    assert info.value.lineno == 3


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("{% set %}", 1),
        ("{% set x %}", 1),
        ("\n{% set x 1 %}", 2),
        ("{% set = 1 %}", 1),
        ("a\n\n{% set a.b = 1 %}", 3),
        ("{% set 1x = 1 %}", 1),
        ("{% set x == 1 %}", 1),
        ("\n{% set x = %}", 2),
        ("{% set x = (1 %}", 1),
        ("{% set x y = 1 %}", 1),
    ],
    ids=[
        "empty",
        "no-value",
        "no-equals",
        "no-name",
        "dotted",
        "bad-name",
        "double-equals",
        "no-expression",
        "bad-expression",
        "two-names",
    ],
)
def test_malformed_set_is_a_syntax_error_naming_the_line(source, line):
    with pytest.raises(TemplateSyntaxError) as info:
        Template(source, name="t.txt")
    assert info.value.lineno == line
    assert str(info.value).startswith(f"t.txt, line {line}: ")
    assert "unknown tag" not in info.value.message


@pytest.mark.parametrize("name", ["true", "false", "none", "and", "or", "not", "in"])
def test_set_rejects_reserved_names(name):
    with pytest.raises(TemplateSyntaxError) as info:
        Template("x\n{% set " + name + " = 1 %}")
    assert info.value.lineno == 2
    assert info.value.message == f"cannot assign to {name!r}"


def test_set_expressions_are_checked_when_compiling():
    with pytest.raises(TemplateSyntaxError, match="unknown filter 'nope'") as info:
        Template("\n{% set x = y | nope %}")
    assert info.value.lineno == 2
    with pytest.raises(TemplateSyntaxError, match="filter 'upper' takes 0 arguments, got 1"):
        Template("{% set x = y | upper(1) %}")
