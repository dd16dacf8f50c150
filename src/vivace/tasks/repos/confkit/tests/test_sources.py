import pytest

from confkit.errors import ConfigError, ParseError, SourceError
from confkit.sources import EnvSource, FileSource, Layer, MappingSource, OverrideSource, TextSource, merge_layers


def test_mapping_source_flattens_nested_mappings():
    source = MappingSource({"server": {"port": 80, "tls": {"cert": "c"}}, "name": "x", "db.host": "h"}, "defaults")
    layer = source.load()
    assert layer.values == {"server.port": 80, "server.tls.cert": "c", "name": "x", "db.host": "h"}
    assert set(layer.origins.values()) == {"defaults"}
    assert list(layer.origins) == list(layer.values)
    assert repr(source) == "<MappingSource defaults>"
    with pytest.raises(ConfigError, match="defaults: invalid key 'bad key'"):
        MappingSource({"bad key": 1}, "defaults").load()


def test_text_source_reports_lines():
    layer = TextSource("a = 1\n\n[s]\nb = two\n", "inline").load()
    assert layer.values == {"a": 1, "s.b": "two"}
    assert layer.origins == {"a": "inline:1", "s.b": "inline:4"}
    with pytest.raises(ParseError, match="^inline:2: "):
        TextSource("a = 1\nnonsense", "inline").load()


def test_file_source(tmp_path):
    path = tmp_path / "app.conf"
    path.write_text("[server]\nport = 8080\n", encoding="utf-8")
    source = FileSource(path)
    assert source.name == str(path)
    layer = source.load()
    assert layer.values == {"server.port": 8080}
    assert layer.origins == {"server.port": f"{path}:2"}
    path.write_text("[server]\nport = 9090\n", encoding="utf-8")
    assert source.load().values == {"server.port": 9090}


def test_missing_files(tmp_path):
    missing = tmp_path / "nope.conf"
    with pytest.raises(SourceError, match="config file not found"):
        FileSource(missing).load()
    assert FileSource(missing, optional=True).load() == Layer()
    with pytest.raises(SourceError, match="cannot read"):
        FileSource(tmp_path).load()


def test_env_source_keys():
    env = {
        "APP_SERVER__PORT": "8080",
        "APP_DEBUG": "true",
        "APP_LOG__FILE_NAME": "x.log",
        "APP_": "ignored",
        "APP_BAD__": "ignored",
        "APP_1X": "ignored",
        "OTHER_PORT": "1",
        "app_lower": "ignored",
    }
    source = EnvSource("APP_", env)
    layer = source.load()
    assert layer.values == {"debug": "true", "log.file_name": "x.log", "server.port": "8080"}
    assert layer.origins["server.port"] == "env:APP_SERVER__PORT"
    assert layer.origins["debug"] == "env:APP_DEBUG"
    assert source.name == "env:APP_*"
    assert source.key_for("APP_A__B__C") == "a.b.c"
    assert source.key_for("XAPP_A") is None
    assert source.variable_for("server.tls.cert") == "APP_SERVER__TLS__CERT"
    assert source.variable_for("log.file_name") == "APP_LOG__FILE_NAME"


def test_env_source_options():
    env = {"MY.DB.HOST": "h", "MY.PORT": "1"}
    source = EnvSource("MY.", env, separator=".")
    assert source.load().values == {"db.host": "h", "port": "1"}
    assert source.variable_for("db.host") == "MY.DB.HOST"
    with pytest.raises(ConfigError, match="needs a prefix"):
        EnvSource("", env)
    assert EnvSource("APP_", {}).load().values == {}


def test_override_source():
    layer = OverrideSource(["server.port=9000", " name = my app ", "tags=[a, b]", "on=true", "empty="]).load()
    assert layer.values == {"server.port": 9000, "name": "my app", "tags": ["a", "b"], "on": True, "empty": ""}
    assert set(layer.origins.values()) == {"override"}
    with pytest.raises(ParseError) as caught:
        OverrideSource(["a=1", " just-a-key "], name="--set").load()
    assert caught.value.line == 2
    assert str(caught.value) == "--set:2: expected key=value, got ' just-a-key '"
    with pytest.raises(ParseError) as caught:
        OverrideSource(["a=1", "b=2", "a b=1"]).load()
    assert str(caught.value) == "override:3: invalid key 'a b'"
    with pytest.raises(ParseError, match="override:1: unterminated string"):
        OverrideSource(['a="x']).load()


def test_merge_layers_precedence():
    low = Layer({"a": 1, "b": 2, "c": 3}, {"a": "low", "b": "low", "c": "low"})
    mid = Layer({"b": 20, "d": 40}, {"b": "mid", "d": "mid"})
    high = Layer({"c": 300, "b": 200}, {"c": "high"})
    merged = merge_layers([low, mid, high])
    assert merged.values == {"a": 1, "b": 200, "c": 300, "d": 40}
    assert list(merged.values) == ["a", "b", "c", "d"]
    assert merged.origins == {"a": "low", "c": "high", "d": "mid"}
    assert low.values == {"a": 1, "b": 2, "c": 3}
    assert merge_layers([]) == Layer()
    assert merge_layers([high]).values == high.values
