from datetime import timedelta

import pytest

from confkit import Config, EnvSource, Schema, TextSource

OLD = """\
name = demo

[server]
host = localhost
port = 8080
timeout = 1h30m

[log]
file = app.log
level = info
"""

NEW = """\
name = demo

[log]
level = debug
targets = [stderr, syslog]

[server]
port = 9090
host = localhost
timeout = 90m
workers = 4
"""


@pytest.fixture
def schema():
    return Schema.from_spec(
        {
            "server": {"port": "int", "timeout": "duration", "workers": "int", "debug": {"type": "bool", "default": False}},
            "log": {"targets": "list"},
        }
    )


def test_diff_of_equal_settings_is_empty(schema):
    config = Config.from_text(OLD, schema)
    assert config.diff(config) == []
    assert config.diff(Config.from_text(OLD, schema)) == []
    assert Config().diff(Config()) == []
    reloaded = Config.load([TextSource(OLD), EnvSource("APP_", {"APP_SERVER__TIMEOUT": "5400s"})], schema)
    assert config.diff(reloaded) == []


def test_added_removed_and_changed(schema):
    from confkit import Change

    old = Config.from_text(OLD, schema)
    new = Config.from_text(NEW, schema)
    changes = old.diff(new)
    assert all(isinstance(change, Change) for change in changes)
    assert [(c.key, c.kind) for c in changes] == [
        ("log.file", "removed"),
        ("log.level", "changed"),
        ("log.targets", "added"),
        ("server.port", "changed"),
        ("server.workers", "added"),
    ]
    by_key = {c.key: c for c in changes}
    assert (by_key["log.file"].old, by_key["log.file"].new) == ("app.log", None)
    assert (by_key["log.level"].old, by_key["log.level"].new) == ("info", "debug")
    assert (by_key["log.targets"].old, by_key["log.targets"].new) == (None, ["stderr", "syslog"])
    assert (by_key["server.port"].old, by_key["server.port"].new) == (8080, 9090)
    assert (by_key["server.workers"].old, by_key["server.workers"].new) == (None, 4)


def test_diff_is_sorted_by_key():
    old = Config({"z": 1, "b.y": 1, "a": 1})
    new = Config({"a": 2, "m": 3, "b.y": 2, "z": 1, "b.a": 0})
    assert [c.key for c in old.diff(new)] == ["a", "b.a", "b.y", "m"]


def test_diff_in_both_directions():
    old = Config({"a": 1, "b": 2, "c": 3})
    new = Config({"b": 2, "c": 30, "d": 4})
    forward = old.diff(new)
    backward = new.diff(old)
    assert [(c.key, c.kind, c.old, c.new) for c in forward] == [
        ("a", "removed", 1, None),
        ("c", "changed", 3, 30),
        ("d", "added", None, 4),
    ]
    assert [(c.key, c.kind, c.old, c.new) for c in backward] == [
        ("a", "added", None, 1),
        ("c", "changed", 30, 3),
        ("d", "removed", 4, None),
    ]


def test_change_lines():
    old = Config({"name": "demo", "port": 8080, "debug": False, "tags": ["a"], "gone": 'say "hi"'})
    new = Config({"name": "demo 2", "port": 9090, "debug": True, "tags": ["a", 1], "ratio": 0.5})
    lines = [str(change) for change in old.diff(new)]
    assert lines == [
        "~ debug: false -> true",
        '- gone = "say \\"hi\\""',
        '~ name: "demo" -> "demo 2"',
        "~ port: 8080 -> 9090",
        "+ ratio = 0.5",
        '~ tags: ["a"] -> ["a", 1]',
    ]


def test_values_are_written_as_their_fields_write_them(schema):
    old = Config.from_text(OLD, schema)
    new = Config.from_text(NEW.replace("timeout = 90m", "timeout = 2h"), schema)
    change = next(c for c in old.diff(new) if c.key == "server.timeout")
    assert change.kind == "changed"
    assert (change.old, change.new) == (timedelta(minutes=90), timedelta(hours=2))
    assert str(change) == '~ server.timeout: "1h30m" -> "2h"'
    removed = Config.from_text(OLD.replace("timeout = 1h30m", "timeout = 45s"), schema).diff(Config.from_text("name = demo\n", schema))
    assert '- server.timeout = "45s"' in [str(c) for c in removed]
    plain = Config({"server.timeout": timedelta(seconds=5)}, schema=schema)
    assert [str(c) for c in Config().diff(plain)] == ['+ server.timeout = "5s"']


def test_diff_of_sections(schema):
    old = Config.from_text(OLD, schema).section("server")
    new = Config.from_text(NEW, schema).section("server")
    changes = old.diff(new)
    assert [(c.key, c.kind) for c in changes] == [("port", "changed"), ("workers", "added")]
    assert [str(c) for c in changes] == ["~ port: 8080 -> 9090", "+ workers = 4"]
