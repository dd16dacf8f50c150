import pytest

from confkit import Config, EnvSource, Field, Schema, SchemaError, TextSource, ValidationError, field_type, field_type_names, make_field


def test_size_is_a_registered_field_type():
    assert "size" in field_type_names()
    assert field_type("size").type_name == "size"
    field = make_field("size")
    assert isinstance(field, Field)
    assert isinstance(field, field_type("size"))
    assert make_field({"type": "size", "default": "1KB"}).default == "1KB"


def test_size_text_and_numbers():
    field = make_field("size")
    assert field.clean("512") == 512
    assert field.clean("512B") == 512
    assert field.clean("10KB") == 10_000
    assert field.clean("1.5MB") == 1_500_000
    assert field.clean("2GB") == 2_000_000_000
    assert field.clean("3TB") == 3 * 1000**4
    assert field.clean("1KiB") == 1024
    assert field.clean("64MiB") == 64 * 1024**2
    assert field.clean("0.5GiB") == 512 * 1024**2
    assert field.clean("2TiB") == 2 * 1024**4
    assert field.clean(2048) == 2048
    assert field.clean(0) == 0
    assert isinstance(field.clean("1.5MB"), int)


def test_size_units_in_any_case_and_spaces():
    field = make_field("size")
    assert field.clean("10mb") == 10_000_000
    assert field.clean("10 MB") == 10_000_000
    assert field.clean(" 4 kib ") == 4096
    assert field.clean("1gb") == 1_000_000_000


def test_bad_sizes():
    field = make_field("size")
    for raw in ("10XB", "MB", "", "ten MB", "-1KB", "1.5B", "0.1KiB", True, 1.5, None, -1):
        with pytest.raises(ValidationError):
            field.clean(raw)


def test_size_bounds_are_written_as_sizes():
    field = make_field({"type": "size", "min": "1KB", "max": "1MiB"})
    assert field.clean("1KB") == 1000
    assert field.clean("1MiB") == 1024**2
    with pytest.raises(ValidationError, match="must be at most 1MiB"):
        field.clean("2MiB")
    with pytest.raises(ValidationError, match="must be at least 1KB"):
        field.clean(999)


def test_size_format():
    field = make_field("size")
    assert field.format(10_000_000) == "10MB"
    assert field.format(64 * 1024**2) == "64MiB"
    assert field.format(1024) == "1KiB"
    assert field.format(3000) == "3KB"
    assert field.format(2**30) == "1GiB"
    assert field.format(5 * 1000**4) == "5TB"
    assert field.format(1536) == "1536B"
    assert field.format(512) == "512B"
    assert field.format(0) == "0B"


def test_sizes_in_a_config():
    schema = Schema.from_spec({"cache": {"limit": {"type": "size", "default": "64MiB"}, "chunk": {"type": "size", "max": "1MB"}}})
    config = Config.load([TextSource("[cache]\nchunk = 4KiB\n", "app.conf")], schema)
    assert config["cache.limit"] == 64 * 1024**2
    assert config["cache.chunk"] == 4096
    config = Config.load([TextSource("[cache]\nchunk = 512\n"), EnvSource("APP_", {"APP_CACHE__LIMIT": "1GB"})], schema)
    assert config["cache.limit"] == 1_000_000_000
    assert config["cache.chunk"] == 512
    text = config.dumps()
    assert 'limit = "1GB"' in text
    assert 'chunk = "512B"' in text
    assert Config.from_text(text, schema) == config
    with pytest.raises(SchemaError, match="cache.chunk: must be at most 1MB"):
        Config.from_text("[cache]\nchunk = 2MB\n", schema)


def test_get_as_size():
    config = Config.from_text("upload = 25MB\nbuffer = 8KiB\n")
    assert config.get_as("upload", "size") == 25_000_000
    assert config.get_as("buffer", "size", max="1MiB") == 8192
