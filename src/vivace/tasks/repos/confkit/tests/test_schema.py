from datetime import timedelta

import pytest

from confkit.errors import ConfigError, SchemaError, ValidationError
from confkit.schema import (
    MISSING,
    BoolField,
    ChoiceField,
    DurationField,
    Field,
    FloatField,
    IntField,
    ListField,
    Schema,
    StrField,
    field_type,
    field_type_names,
    format_duration,
    make_field,
    parse_duration,
    register_field,
)


def test_registry():
    assert {"str", "int", "float", "bool", "list", "choice", "duration"} <= set(field_type_names())
    assert field_type_names() == sorted(field_type_names())
    assert field_type("int") is IntField
    assert field_type("duration") is DurationField
    with pytest.raises(ConfigError, match=r"unknown field type 'decimal' \(known: bool, choice, "):
        field_type("decimal")

    class Again(Field):
        type_name = "int"

        def convert(self, raw):
            return raw

    with pytest.raises(ValueError, match="already registered"):
        register_field(Again)
    assert field_type("int") is IntField


def test_make_field():
    assert isinstance(make_field("str"), StrField)
    field = make_field({"type": "int", "min": 1, "default": 5, "help": "how many"})
    assert field.help == "how many"
    assert isinstance(field, IntField)
    assert (field.min, field.max, field.default, field.required) == (1, None, 5, False)
    spec = {"type": "bool"}
    make_field(spec)
    assert spec == {"type": "bool"}
    with pytest.raises(ConfigError, match="without a type"):
        make_field({"default": 1})
    with pytest.raises(ConfigError, match="bad options for a int field"):
        make_field({"type": "int", "colour": "red"})
    with pytest.raises(ConfigError, match="required field cannot have a default"):
        make_field({"type": "str", "required": True, "default": "x"})


def test_str_field():
    field = StrField()
    assert field.clean("abc") == "abc"
    assert field.clean(42) == "42"
    assert field.clean(1.5) == "1.5"
    assert field.clean(True) == "true"
    assert field.clean(False) == "false"
    with pytest.raises(ValidationError, match="expected text, got list"):
        field.clean(["a"])
    pattern = StrField(pattern=r"[a-z]+")
    assert pattern.clean("abc") == "abc"
    with pytest.raises(ValidationError, match="does not match"):
        pattern.clean("abc1")
    assert field.default is MISSING
    assert repr(field) == "<str field>"


def test_int_field():
    field = IntField(min=1, max=10)
    assert field.clean(1) == 1
    assert field.clean(10) == 10
    assert field.clean(" 7 ") == 7
    assert field.clean("1_0") == 10
    with pytest.raises(ValidationError, match="must be at least 1, got 0"):
        field.clean(0)
    with pytest.raises(ValidationError, match="must be at most 10, got 11"):
        field.clean("11")
    for bad in ("7.5", 7.0, True, "seven", None):
        with pytest.raises(ValidationError, match="expected an integer"):
            field.clean(bad)
    assert IntField().clean(-5) == -5
    with pytest.raises(ConfigError, match="min is greater than max"):
        IntField(min=5, max=4)
    assert IntField(min=4, max=4).clean(4) == 4


def test_float_field():
    field = FloatField(min=0, max=1)
    assert field.clean(0.5) == 0.5
    assert field.clean(1) == 1.0
    assert isinstance(field.clean(1), float)
    assert field.clean("0.25") == 0.25
    assert field.clean("0") == 0.0
    with pytest.raises(ValidationError, match="must be at most 1.0, got 1.5"):
        field.clean(1.5)
    with pytest.raises(ValidationError, match="must be at least 0.0"):
        field.clean(-0.1)
    with pytest.raises(ValidationError, match="expected a number"):
        field.clean("half")
    with pytest.raises(ValidationError, match="expected a number"):
        field.clean(False)


def test_bool_field():
    field = BoolField()
    for raw in (True, "true", "YES", " on ", "1", "True"):
        assert field.clean(raw) is True, raw
    for raw in (False, "false", "No", "off", "0"):
        assert field.clean(raw) is False, raw
    for raw in ("maybe", "", 1, 0, None):
        with pytest.raises(ValidationError, match="expected true or false"):
            field.clean(raw)


def test_choice_field():
    field = ChoiceField(choices=["debug", "info", "error"], default="info")
    assert field.clean("debug") == "debug"
    assert field.clean(" error ") == "error"
    assert field.default == "info"
    with pytest.raises(ValidationError, match="expected one of debug, info, error, got 'INFO'"):
        field.clean("INFO")
    with pytest.raises(ValidationError, match="got int 3"):
        field.clean(3)
    with pytest.raises(ConfigError, match="at least one choice"):
        ChoiceField(choices=[])


def test_list_field():
    field = ListField(item={"type": "int", "min": 0})
    assert field.clean([1, "2", 3]) == [1, 2, 3]
    assert field.clean("4, 5,6") == [4, 5, 6]
    assert field.clean("") == []
    assert field.clean(()) == []
    with pytest.raises(ValidationError, match=r"^item 1: must be at least 0, got -1$"):
        field.clean([0, -1])
    with pytest.raises(ValidationError, match="expected a list, got int 5"):
        field.clean(5)
    words = ListField(separator=":", min_items=2)
    assert words.clean("a:b: c") == ["a", "b", "c"]
    assert words.clean(["x", 1]) == ["x", "1"]
    with pytest.raises(ValidationError, match="at least 2 items, got 1"):
        words.clean("a")
    assert isinstance(ListField().item, StrField)


def test_parse_duration():
    assert parse_duration("1h30m") == timedelta(hours=1, minutes=30)
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("2d") == timedelta(days=2)
    assert parse_duration("250ms") == timedelta(milliseconds=250)
    assert parse_duration("1m500ms") == timedelta(minutes=1, milliseconds=500)
    assert parse_duration("1.5h") == timedelta(minutes=90)
    assert parse_duration(" 1h 5s ") == timedelta(hours=1, seconds=5)
    assert parse_duration("45") == timedelta(seconds=45)
    assert parse_duration("0.5") == timedelta(milliseconds=500)
    for bad in ("", "h", "10x", "1h30", "m5", "5 minutes", "1h-5m"):
        with pytest.raises(ValidationError):
            parse_duration(bad)


def test_format_duration():
    assert format_duration(timedelta(0)) == "0s"
    assert format_duration(timedelta(hours=1, minutes=30)) == "1h30m"
    assert format_duration(timedelta(days=1, seconds=1)) == "1d1s"
    assert format_duration(timedelta(seconds=90)) == "1m30s"
    assert format_duration(timedelta(milliseconds=1500)) == "1s500ms"
    assert format_duration(timedelta(hours=-2)) == "-2h"
    for text in ("2d3h4m5s6ms", "59m", "1h1ms"):
        assert format_duration(parse_duration(text)) == text


def test_duration_field():
    field = DurationField(min="1s", max="1h")
    assert field.clean("30m") == timedelta(minutes=30)
    assert field.clean(2) == timedelta(seconds=2)
    assert DurationField().clean(0) == timedelta(0)
    assert field.clean(1.5) == timedelta(seconds=1.5)
    assert field.clean(timedelta(minutes=5)) == timedelta(minutes=5)
    assert field.clean("1h") == timedelta(hours=1)
    with pytest.raises(ValidationError, match="must be at least 1s, got 500ms"):
        field.clean("500ms")
    with pytest.raises(ValidationError, match="must be at most 1h, got 1h1s"):
        field.clean("1h1s")
    with pytest.raises(ValidationError, match="cannot be negative"):
        DurationField().clean(-1)
    with pytest.raises(ValidationError, match="expected a duration, got bool"):
        field.clean(True)
    assert field.format(timedelta(minutes=2)) == "2m"


def test_schema_from_spec():
    schema = Schema.from_spec(
        {
            "name": "str",
            "server": {
                "port": {"type": "int", "default": 8080},
                "tls": {"cert": {"type": "str", "required": True}},
            },
            "log.level": {"type": "choice", "choices": ["info", "debug"], "default": "info"},
        }
    )
    assert schema.keys() == ["name", "server.port", "server.tls.cert", "log.level"]
    assert len(schema) == 4
    assert "server.port" in schema
    assert "server" not in schema
    assert isinstance(schema["server.port"], IntField)
    assert schema.get("missing") is None
    assert schema.get("name") is schema["name"]
    assert schema.defaults() == {"server.port": 8080, "log.level": "info"}
    sub = schema.section("server")
    assert sub.keys() == ["port", "tls.cert"]
    assert sub["port"] is schema["server.port"]


def test_schema_add_checks_keys():
    schema = Schema({"a.b": IntField()})
    with pytest.raises(ConfigError, match="field 'a.b' is already defined"):
        schema.add("a.b", StrField())
    with pytest.raises(ConfigError, match="invalid key"):
        schema.add("a b", StrField())
    with pytest.raises(ConfigError, match="both a value and a section"):
        schema.add("a", StrField())
    with pytest.raises(ConfigError, match="both a value and a section"):
        schema.add("a.b.c", StrField())
    assert schema.keys() == ["a.b"]


def test_validate_converts_and_keeps_order():
    schema = Schema({"port": IntField(), "debug": BoolField(), "tags": ListField()})
    values = {"extra": "x", "tags": "a,b", "port": "80", "debug": "on"}
    assert schema.validate(values) == {"extra": "x", "tags": ["a", "b"], "port": 80, "debug": True}
    assert list(schema.validate(values)) == ["extra", "tags", "port", "debug"]
    assert values["port"] == "80"
    assert schema.validate({}) == {}


def test_validate_reports_every_problem():
    schema = Schema({"b.port": IntField(), "a.name": StrField(required=True), "c.on": BoolField()})
    with pytest.raises(SchemaError) as caught:
        schema.validate({"b.port": "x", "c.on": "maybe", "zz": 1}, {"b.port": "app.conf:3"}, strict=True)
    errors = caught.value.errors
    assert [e.key for e in errors] == ["a.name", "b.port", "c.on", "zz"]
    assert [e.origin for e in errors] == [None, "app.conf:3", None, None]
    assert errors[0].message == "is required"
    assert errors[3].message == "unknown setting"
    assert str(errors[1]) == "b.port: expected an integer, got str 'x' (from app.conf:3)"
    assert str(caught.value).splitlines()[0] == "4 invalid settings:"
    assert "  a.name: is required" in str(caught.value).splitlines()
    with pytest.raises(SchemaError, match="^1 invalid setting:"):
        schema.validate({"a.name": "n", "c.on": "x"})


def test_schema_format():
    schema = Schema({"t": DurationField(), "l": ListField(item="duration"), "n": IntField()})
    assert schema.format("t", timedelta(seconds=90)) == "1m30s"
    assert schema.format("l", [timedelta(hours=1), timedelta(0)]) == ["1h", "0s"]
    assert schema.format("n", 3) == 3
    assert schema.format("other", timedelta(seconds=1)) == timedelta(seconds=1)
