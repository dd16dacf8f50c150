import pytest

from confkit.errors import CycleError, InterpolationError
from confkit.interpolate import interpolate


def test_references_in_text():
    values = {"host": "example.org", "port": 8080, "secure": True, "url": "http://${host}:${port}/?s=${secure}"}
    result = interpolate(values)
    assert result["url"] == "http://example.org:8080/?s=true"
    assert result["port"] == 8080
    assert values["url"] == "http://${host}:${port}/?s=${secure}"
    assert interpolate({"a": "x", "b": "${a}${a}-${ a }"})["b"] == "xx-x"


def test_whole_reference_keeps_the_type():
    result = interpolate({"base.limit": 10, "ratio": 0.5, "on": False, "list": [1, 2], "a": "${base.limit}", "b": "${ratio}", "c": "${on}", "d": "${list}"})
    assert result["a"] == 10
    assert result["b"] == 0.5
    assert result["c"] is False
    assert result["d"] == [1, 2]
    assert interpolate({"a": 1, "b": " ${a}"})["b"] == " 1"


def test_references_are_followed_through_chains():
    values = {"c": "${b}/c", "b": "${a}/b", "a": "root", "d": "${c}"}
    assert interpolate(values) == {"c": "root/b/c", "b": "root/b", "a": "root", "d": "root/b/c"}
    assert list(interpolate(values)) == ["c", "b", "a", "d"]


def test_relative_references():
    values = {"server.host": "h", "server.url": "${.host}:1", "db.host": "d", "db.url": "${.host}", "top": "t", "x": "${.top}"}
    result = interpolate(values)
    assert result["server.url"] == "h:1"
    assert result["db.url"] == "d"
    assert result["x"] == "t"


def test_references_in_lists():
    result = interpolate({"dir": "/srv", "paths": ["${dir}/a", "plain", 3, ["${dir}"]]})
    assert result["paths"] == ["/srv/a", "plain", 3, ["/srv"]]
    result = interpolate({"s.dir": "/x", "s.paths": ["${.dir}/a", ["${.dir}"]]})
    assert result["s.paths"] == ["/x/a", ["/x"]]


def test_dollar_escapes():
    result = interpolate({"a": "x", "price": "$$5 and $${a} and ${a}", "lone": "$ alone $", "b": "$$"})
    assert result["price"] == "$5 and ${a} and x"
    assert result["lone"] == "$ alone $"
    assert result["b"] == "$"


def test_cycles():
    with pytest.raises(CycleError) as caught:
        interpolate({"a": "${b}", "b": "x${c}", "c": "${a}", "d": 1})
    assert caught.value.chain == ["a", "b", "c", "a"]
    assert caught.value.key == "a"
    assert str(caught.value) == "a: reference cycle a -> b -> c -> a"
    with pytest.raises(CycleError) as caught:
        interpolate({"ok": "${x}", "x": "${self}", "self": "${self}"})
    assert caught.value.chain == ["self", "self"]
    assert isinstance(caught.value, InterpolationError)


def test_unresolvable_references():
    with pytest.raises(InterpolationError) as caught:
        interpolate({"a": 1, "url": "${server.hots}"})
    assert caught.value.key == "url"
    assert str(caught.value) == "url: unknown setting 'server.hots' in ${server.hots}"
    assert caught.value.message == "unknown setting 'server.hots' in ${server.hots}"
    cases = [
        ({"a": 1, "b": "${a b}"}, "bad reference ${a b}"),
        ({"b": "x${}"}, "bad reference ${}"),
        ({"a": 1, "b": "${a} and ${a"}, "unterminated reference in '${a} and ${a'"),
        ({"l": [1], "b": "x${l}"}, "cannot insert ${l} (list) into text"),
    ]
    for values, message in cases:
        with pytest.raises(InterpolationError) as caught:
            interpolate(values)
        assert caught.value.key == "b"
        assert caught.value.message == message
        assert str(caught.value) == f"b: {message}"
