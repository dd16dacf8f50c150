from datetime import timedelta

import pytest

from confkit import (
    Config,
    EnvSource,
    KeyConflictError,
    MappingSource,
    MissingKeyError,
    OverrideSource,
    ParseError,
    Schema,
    SchemaError,
    TextSource,
    ValidationError,
    load_config,
)

APP_CONF = """\
name = demo

[server]
host = localhost
port = 8080
timeout = 1h30m
url = "http://${.host}:${.port}"

[log]
level = debug
"""


@pytest.fixture
def schema():
    return Schema.from_spec(
        {
            "name": {"type": "str", "required": True},
            "server": {
                "host": {"type": "str", "default": "0.0.0.0"},
                "port": {"type": "int", "min": 1, "max": 65535, "default": 80},
                "timeout": {"type": "duration", "default": "30s"},
                "workers": {"type": "int", "default": 2},
                "url": "str",
            },
            "log": {
                "level": {"type": "choice", "choices": ["debug", "info", "error"], "default": "info"},
                "targets": {"type": "list", "default": ["stderr"]},
            },
            "debug": {"type": "bool", "default": False},
        }
    )


def test_from_text_with_schema(schema):
    config = Config.from_text(APP_CONF, schema, source="app.conf")
    assert config["name"] == "demo"
    assert config["server.port"] == 8080
    assert config["server.timeout"] == timedelta(hours=1, minutes=30)
    assert config["server.workers"] == 2
    assert config["server.url"] == "http://localhost:8080"
    assert config["log.level"] == "debug"
    assert config["log.targets"] == ["stderr"]
    assert config["debug"] is False
    assert len(config) == 9
    assert config.origin("server.port") == "app.conf:5"
    assert config.origin("server.workers") == "default"
    assert config.origin("name") == "app.conf:1"


def test_without_schema_values_stay_raw():
    config = Config.from_text(APP_CONF)
    assert config["server.timeout"] == "1h30m"
    assert config["server.port"] == 8080
    assert config.keys() == ["name", "server.host", "server.port", "server.timeout", "server.url", "log.level"]
    assert config["server.url"] == "http://localhost:8080"
    assert config.schema is None


def test_precedence_of_sources(schema):
    env = {"APP_SERVER__PORT": "9000", "APP_DEBUG": "yes", "APP_SERVER__HOST": "env-host"}
    config = Config.load(
        [
            TextSource(APP_CONF, "app.conf"),
            TextSource("[server]\nport = 8500\nworkers = 8\n", "local.conf"),
            EnvSource("APP_", env),
            OverrideSource(["server.host=cli-host"]),
        ],
        schema,
    )
    assert config["server.port"] == 9000
    assert config.origin("server.port") == "env:APP_SERVER__PORT"
    assert config["server.workers"] == 8
    assert config.origin("server.workers") == "local.conf:3"
    assert config["debug"] is True
    assert config["server.host"] == "cli-host"
    assert config.origin("server.host") == "override"
    assert config["server.url"] == "http://cli-host:9000"
    assert config["server.timeout"] == timedelta(minutes=90)


def test_errors_name_their_origin(schema):
    env = {"APP_SERVER__PORT": "0", "APP_LOG__LEVEL": "loud"}
    with pytest.raises(SchemaError) as caught:
        Config.load([TextSource("name = x\n[server]\ntimeout = soon\n", "a.conf"), EnvSource("APP_", env)], schema)
    messages = [str(error) for error in caught.value.errors]
    assert messages == [
        "log.level: expected one of debug, info, error, got 'loud' (from env:APP_LOG__LEVEL)",
        "server.port: must be at least 1, got 0 (from env:APP_SERVER__PORT)",
        "server.timeout: bad duration 'soon' (use units d, h, m, s, ms as in '1h30m') (from a.conf:3)",
    ]
    with pytest.raises(SchemaError, match="name: is required"):
        Config.load([], schema)


def test_strict_rejects_unknown_settings(schema):
    text = "name = x\nextra = 1\n[server]\nport = 1\n"
    assert Config.from_text(text, schema)["extra"] == 1
    with pytest.raises(SchemaError) as caught:
        Config.from_text(text, schema, source="s.conf", strict=True)
    assert [(e.key, e.message, e.origin) for e in caught.value.errors] == [("extra", "unknown setting", "s.conf:2")]


def test_resolve_can_be_turned_off():
    config = Config.load([TextSource("a = 1\nb = ${a}\n")], resolve=False)
    assert config["b"] == "${a}"
    assert Config.load([TextSource("a = 1\nb = ${a}\n")])["b"] == 1


def test_conflicting_sources():
    with pytest.raises(KeyConflictError):
        Config.load([TextSource("[server]\nport = 1\n"), OverrideSource(["server=off"])])
    with pytest.raises(KeyConflictError):
        Config({"a": 1, "a.b": 2})


def test_get_and_missing_keys(schema):
    config = Config.from_text(APP_CONF, schema)
    assert config.get("server.port") == 8080
    assert config.get("server.nope", 5) == 5
    assert config.get("server.nope", None) is None
    with pytest.raises(MissingKeyError) as caught:
        config["server.nope"]
    assert caught.value.key == "server.nope"
    assert caught.value.args == ("server.nope",)
    assert str(caught.value) == "no setting 'server.nope'"
    assert isinstance(caught.value, KeyError)
    with pytest.raises(MissingKeyError):
        config["server"]
    assert "server.port" in config
    assert "server" not in config
    with pytest.raises(MissingKeyError):
        config.origin("nope")


def test_get_as():
    config = Config.load([TextSource("ttl = 5m\nport = '81'\nflags = a;b\n", "c.conf")])
    assert config.get_as("ttl", "duration") == timedelta(minutes=5)
    assert config.get_as("port", "int", max=100) == 81
    assert config.get_as("flags", "list", separator=";") == ["a", "b"]
    with pytest.raises(ValidationError) as caught:
        config.get_as("port", "int", max=80)
    assert caught.value.key == "port"
    assert caught.value.origin == "c.conf:2"
    assert str(caught.value) == "port: must be at most 80, got 81 (from c.conf:2)"
    with pytest.raises(MissingKeyError):
        config.get_as("nope", "int")


def test_iteration_and_equality():
    config = Config({"b": 2, "a.x": 1}, origins={"b": "here", "zzz": "ignored"})
    assert list(config) == ["b", "a.x"]
    assert config.items() == [("b", 2), ("a.x", 1)]
    assert config == Config({"a.x": 1, "b": 2})
    assert config != Config({"a.x": 1, "b": 3})
    assert config != {"b": 2, "a.x": 1}
    assert (config == {"b": 2, "a.x": 1}) is False
    assert config.origin("b") == "here"
    assert config.origin("a.x") is None
    assert repr(Config({"a": 1})) == "Config({'a': 1})"


def test_sections(schema):
    config = Config.from_text(APP_CONF + "[server.tls]\ncert = c.pem\n", schema, source="app.conf")
    assert config.sections() == ["log", "server", "server.tls"]
    server = config.section("server")
    assert server["port"] == 8080
    assert server["tls.cert"] == "c.pem"
    assert "host" in server
    assert "name" not in server
    assert server.origin("port") == "app.conf:5"
    assert server.origin("tls.cert") == "app.conf:12"
    assert server.origin("workers") == "default"
    assert Config({"server.a": 1, "xxxxxxxb": 2}, origins={"xxxxxxxb": "top"}).section("server").origin("a") is None
    assert server.schema.keys() == ["host", "port", "timeout", "workers", "url"]
    assert config.section("server.tls").keys() == ["cert"]
    with pytest.raises(MissingKeyError):
        config.section("nope")
    assert Config({"a": 1}).sections() == []


def test_merge(schema):
    base = Config.from_text(APP_CONF, schema, source="app.conf")
    merged = base.merge({"server": {"port": "9999"}, "debug": "on"}, origin="cli")
    assert merged["server.port"] == 9999
    assert merged["debug"] is True
    assert merged.origin("server.port") == "cli"
    assert merged.origin("server.host") == "app.conf:4"
    assert base["server.port"] == 8080
    assert merged.schema is schema
    with pytest.raises(SchemaError, match="server.port: expected an integer"):
        base.merge({"server.port": "many"})
    other = Config({"server.port": 1, "extra": "x"}, origins={"server.port": "other"})
    both = base.merge(other)
    assert both["server.port"] == 1
    assert both.origin("server.port") == "other"
    assert both.origin("extra") is None
    assert both["extra"] == "x"
    assert Config({"a": 1}).merge(base).schema is schema
    assert Config({"a": 1}).merge({"b": 2}) == Config({"a": 1, "b": 2})


def test_as_dict(schema):
    config = Config.from_text(APP_CONF, schema)
    nested = config.as_dict()
    assert nested["server"]["port"] == 8080
    assert nested["log"] == {"level": "debug", "targets": ["stderr"]}
    assert nested["name"] == "demo"
    assert set(nested) == {"name", "server", "log", "debug"}


def test_dumps_round_trip(schema):
    config = Config.from_text(APP_CONF, schema)
    text = config.dumps()
    assert 'timeout = "1h30m"' in text
    assert "[server]\n" in text
    assert "debug = false" in text
    assert Config.from_text(text, schema) == config
    assert Config({"a.b": 1, "c": "x"}).dumps() == 'c = "x"\n\n[a]\nb = 1\n'


def test_load_config(tmp_path, schema):
    base = tmp_path / "base.conf"
    base.write_text(APP_CONF, encoding="utf-8")
    local = tmp_path / "local.conf"
    local.write_text("[server]\nport = 7000\nworkers = 3\n", encoding="utf-8")
    env = {"SVC_SERVER__WORKERS": "5", "APP_SERVER__WORKERS": "99"}
    config = load_config(schema=schema, files=[base, local], env=env, env_prefix="SVC_", overrides=["log.level=error"])
    assert config["server.port"] == 7000
    assert config.origin("server.port") == f"{local}:2"
    assert config["server.workers"] == 5
    assert config["log.level"] == "error"
    assert config["server.host"] == "localhost"
    plain = load_config(files=[base], env=env)
    assert plain["server.port"] == 8080
    assert "server.workers" not in plain


def test_load_config_strict(tmp_path, schema):
    path = tmp_path / "app.conf"
    path.write_text(APP_CONF + "[extra]\nkey = 1\n", encoding="utf-8")
    assert load_config(schema=schema, files=[path])["extra.key"] == 1
    with pytest.raises(SchemaError, match="extra.key: unknown setting"):
        load_config(schema=schema, files=[path], strict=True)


def test_load_config_reports_parse_errors(tmp_path):
    path = tmp_path / "broken.conf"
    path.write_text("[ok]\na = 1\n[broken\n", encoding="utf-8")
    with pytest.raises(ParseError) as caught:
        load_config(files=[path])
    assert caught.value.line == 3
    assert caught.value.source == str(path)


def test_mapping_defaults_under_files():
    config = Config.load([MappingSource({"server": {"port": 1, "host": "h"}}, "builtin"), TextSource("[server]\nport = 2\n", "f")])
    assert config["server.port"] == 2
    assert config["server.host"] == "h"
    assert config.origin("server.host") == "builtin"
