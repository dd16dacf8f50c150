import pytest

from confkit.errors import KeyConflictError
from confkit.keys import check_conflicts, flatten, is_key, is_name, is_within, join, nest, split


def test_names_and_keys():
    assert is_name("port")
    assert is_name("_private-2")
    assert not is_name("2port")
    assert not is_name("a.b")
    assert not is_name("")
    assert is_key("server.tls.cert")
    assert is_key("a")
    assert not is_key("a..b")
    assert not is_key(".a")
    assert not is_key("a.")
    assert not is_key("a b")


def test_join_split_within():
    assert join("", "port") == "port"
    assert join("server.tls", "cert") == "server.tls.cert"
    assert split("server.tls.cert") == ("server.tls", "cert")
    assert split("port") == ("", "port")
    assert is_within("server.port", "server")
    assert is_within("server.tls.cert", "server")
    assert not is_within("server", "server")
    assert not is_within("servers.port", "server")


def test_conflicts():
    check_conflicts(["a.b", "a.c", "ab", "a-b", "a0.c"])
    check_conflicts([])
    with pytest.raises(KeyConflictError) as caught:
        check_conflicts(["a-x", "a.b.c", "a"])
    assert (caught.value.key, caught.value.other) == ("a", "a.b.c")
    assert str(caught.value) == "'a' is both a value and a section (it contains 'a.b.c')"
    with pytest.raises(KeyConflictError):
        check_conflicts(["x.y.z", "x.y"])
    with pytest.raises(KeyConflictError):
        check_conflicts(key for key in ["x.y", "x"])


def test_flatten_and_nest():
    nested = {"name": "n", "server": {"port": 1, "tls": {"cert": "c"}}, "empty": {}}
    flat = flatten(nested)
    assert flat == {"name": "n", "server.port": 1, "server.tls.cert": "c"}
    assert nest(flat) == {"name": "n", "server": {"port": 1, "tls": {"cert": "c"}}}
    assert flatten({"a.b": 1, "a": {"c": 2}}) == {"a.b": 1, "a.c": 2}
    assert flatten({"a": {"b": 1}}, "root") == {"root.a.b": 1}
    assert nest({}) == {}
