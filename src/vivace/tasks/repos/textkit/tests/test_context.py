import pytest

from textkit.context import Context, Undefined, get_attribute


def test_lookup_walks_the_chain():
    outer = Context({"a": 1, "b": 2})
    inner = outer.push({"b": 3})
    assert inner.lookup("a") == 1
    assert inner.lookup("b") == 3
    assert outer.lookup("b") == 2
    with pytest.raises(KeyError):
        inner.lookup("c")
    assert "a" in inner and "c" not in inner


def test_set_binds_in_the_current_scope_only():
    outer = Context({"x": 1})
    inner = outer.push()
    inner.set("x", 2)
    inner.set("y", 3)
    assert inner.lookup("x") == 2
    assert outer.lookup("x") == 1
    assert "y" not in outer


def test_depth_and_flatten():
    ctx = Context({"a": 1, "b": 1}).push({"b": 2}).push({"c": 3})
    assert ctx.depth == 3
    assert Context().depth == 1
    assert ctx.flatten() == {"a": 1, "b": 2, "c": 3}


def test_none_values_are_defined():
    ctx = Context({"a": None})
    assert "a" in ctx
    assert ctx.resolve(["a"]) is None


def test_resolve_paths():
    ctx = Context({"u": {"name": "Ann", "tags": ["x", "y"]}})
    assert ctx.resolve(["u", "name"]) == "Ann"
    assert ctx.resolve(["u", "tags", "1"]) == "y"
    missing = ctx.resolve(["u", "tags", "2"])
    assert isinstance(missing, Undefined) and missing.name == "u.tags.2"
    assert ctx.resolve(["u", "nope", "deeper"]).name == "u.nope"
    assert ctx.resolve(["v"]).name == "v"


def test_get_attribute():
    class Obj:
        visible = 1
        _hidden = 2

    sentinel = get_attribute(Obj(), "_hidden")
    assert get_attribute(Obj(), "visible") == 1
    assert get_attribute(Obj(), "missing") is sentinel
    assert get_attribute([10, 20], "0") == 10
    assert get_attribute([10, 20], "1") == 20
    assert get_attribute([10, 20], "2") is sentinel
    assert get_attribute("abc", "0") is sentinel
    assert get_attribute({"0": "k"}, "0") == "k"


def test_undefined_behaves_as_empty():
    u = Undefined("x")
    assert str(u) == ""
    assert not u
    assert len(u) == 0
    assert list(u) == []
    assert u == Undefined("y")
    assert u != ""
    assert repr(u) == "Undefined('x')"
    assert hash(u) == hash(Undefined("z"))
