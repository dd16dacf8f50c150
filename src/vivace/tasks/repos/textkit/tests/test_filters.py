import pytest

from textkit import FilterError, FilterRegistry, FilterSpec, default_filters, render
from textkit.context import Undefined
from textkit.filters import require_int, require_number, require_sequence, to_text


def f(name, value, *args):
    return default_filters.apply(name, value, args)


def test_case_filters():
    assert f("upper", "abc") == "ABC"
    assert f("lower", "AbC") == "abc"
    assert f("title", "hello big world") == "Hello Big World"
    assert f("capitalize", "hELLO wORLD") == "Hello world"
    assert f("capitalize", "") == ""
    assert f("trim", "  x y \n") == "x y"
    assert f("upper", None) == ""


def test_default():
    assert f("default", Undefined("x"), "d") == "d"
    assert f("default", None, "d") == "d"
    assert f("default", "", "d") == ""
    assert f("default", "", "d", True) == "d"
    assert f("default", 0, "d", True) == "d"
    assert f("default", "v", "d", True) == "v"


def test_join_and_length():
    assert f("join", [1, "a", None, True]) == "1atrue"
    assert f("join", ("a", "b"), ", ") == "a, b"
    assert f("length", [1, 2, 3]) == 3
    assert f("length", "") == 0
    with pytest.raises(FilterError, match="join: expected a list, got str"):
        f("join", "abc")
    with pytest.raises(FilterError, match="length: int has no length"):
        f("length", 5)


def test_first_last_reverse_sort():
    assert f("first", [4, 5, 6]) == 4
    assert f("last", [4, 5, 6]) == 6
    assert f("first", "xyz") == "x"
    assert f("last", "xyz") == "z"
    assert f("first", []) is None
    assert f("last", []) is None
    assert f("reverse", [1, 2, 3]) == [3, 2, 1]
    assert f("reverse", "abc") == "cba"
    assert f("sort", [3, 1, 2]) == [1, 2, 3]
    assert f("sort", [3, 1, 2], True) == [3, 2, 1]
    with pytest.raises(FilterError, match="cannot be compared"):
        f("sort", [1, "a"])


def test_truncate_and_wordwrap_filters():
    assert f("truncate", "a" * 30) == "a" * 30
    assert f("truncate", "a" * 31) == "a" * 27 + "..."
    assert f("truncate", "hello world", 8, "~") == "hello w~"
    assert f("wordwrap", "aa bb cc", 5) == "aa bb\ncc"
    with pytest.raises(FilterError, match="truncate: length must be an integer"):
        f("truncate", "abc", "5")
    with pytest.raises(FilterError, match="shorter than the suffix"):
        f("truncate", "abcdef", 2)
    with pytest.raises(FilterError, match="width must be at least 1, got 0"):
        f("wordwrap", "abc", 0)
    assert f("wordwrap", "ab c", 1) == "a\nb\nc"


def test_replace_round_int():
    assert f("replace", "a-b-c", "-", "+") == "a+b+c"
    assert f("replace", "a-b-c", "-", "+", 1) == "a+b-c"
    assert f("round", 2.5) == 2
    assert f("round", 2.675, 1) == 2.7
    assert f("round", "3.14159", 2) == 3.14
    assert f("int", "42") == 42
    assert f("int", 3.9) == 3
    assert f("int", "x") == 0
    assert f("int", "x", -1) == -1
    with pytest.raises(FilterError, match="round: value must be a number"):
        f("round", "abc")


def test_misc_filters():
    assert f("slugify", "Hello, World!") == "hello-world"
    assert f("indent", "a\nb", 2) == "a\n  b"
    assert f("wordcount", " one two  three ") == 3
    assert f("escape", "<a href='x'>&") == "&lt;a href=&#x27;x&#x27;&gt;&amp;"


def test_filters_in_templates():
    assert render("{{ items | sort | join(', ') | upper }}", items=["b", "a"]) == "A, B"
    assert render("{{ title | default('Untitled') }}") == "Untitled"
    assert render("{{ n | default(0) > 3 }}", n=5) == "true"


def test_to_text():
    assert to_text(None) == ""
    assert to_text(Undefined("a")) == ""
    assert to_text(False) == "false"
    assert to_text(0) == "0"
    assert to_text([1]) == "[1]"


def test_require_helpers():
    assert require_int(3, "f") == 3
    with pytest.raises(FilterError, match="f: size must be an integer, got True"):
        require_int(True, "f", "size")
    with pytest.raises(FilterError):
        require_int(1.0, "f")
    assert require_number("7", "f") == 7
    assert require_number("7.5", "f") == 7.5
    assert require_number(2.0, "f") == 2.0
    with pytest.raises(FilterError, match="f: value must be a number, got False"):
        require_number(False, "f")
    with pytest.raises(FilterError):
        require_number(None, "f")
    assert require_sequence((1, 2), "f") == [1, 2]
    assert require_sequence(iter("ab"), "f") == ["a", "b"]
    with pytest.raises(FilterError, match="expected a list, got dict"):
        require_sequence({}, "f")


def test_registry_register_get_and_parents():
    parent = FilterRegistry()
    parent.register("a")(lambda v: "parent-a")
    child = parent.child()
    child.register("a")(lambda v: "child-a")
    child.register("b", min_args=1, max_args=2)(lambda v, x, y=0: x + y)
    assert child.apply("a", None) == "child-a"
    assert parent.apply("a", None) == "parent-a"
    assert child.apply("b", None, [1, 2]) == 3
    assert child.names() == ["a", "b"]
    assert "b" in child and "b" not in parent
    assert child.get("b").max_args == 2
    assert parent.child().get("a").func(None) == "parent-a"
    with pytest.raises(KeyError):
        parent.get("b")


def test_registry_rejects_bad_specs():
    registry = FilterRegistry()
    with pytest.raises(ValueError, match="invalid filter name"):
        registry.register("no-dash")(str)
    with pytest.raises(ValueError, match="bad argument range 2..1"):
        registry.add(FilterSpec("x", str, 2, 1))
    with pytest.raises(ValueError, match="bad argument range"):
        registry.add(FilterSpec("x", str, -1, 0))
    registry.add(FilterSpec("x", str, 1, 1))
    assert registry.get("x").min_args == 1


def test_arity_error_messages():
    assert FilterSpec("x", str, 1, 1).arity_error(1) is None
    assert FilterSpec("x", str, 1, 1).arity_error(0) == "filter 'x' takes 1 argument, got 0"
    assert FilterSpec("x", str, 2, 2).arity_error(1) == "filter 'x' takes 2 arguments, got 1"
    assert FilterSpec("x", str, 0, 2).arity_error(3) == "filter 'x' takes 0 to 2 arguments, got 3"
    assert FilterSpec("x", str, 0, 2).arity_error(2) is None
    assert FilterSpec("x", str, 0, 2).arity_error(0) is None
