import pytest
from ledger.errors import SplitError
from ledger.money import Money
from ledger.splits import SplitStrategy, get_strategy, parse_percent, register, strategy_names


def cents(parts: dict[str, Money]) -> dict[str, int]:
    return {name: m.cents for name, m in parts.items()}


def test_registry_lists_builtin_strategies():
    names = strategy_names()
    assert {"equal", "exact", "percent", "shares"} <= set(names)
    assert names == sorted(names)
    assert get_strategy("equal").name == "equal"
    with pytest.raises(SplitError, match=r"unknown split 'thirds' \(known: .*equal, exact"):
        get_strategy("thirds")


def test_registering_a_name_twice_fails():
    class Again(SplitStrategy):
        name = "equal"

        def compute(self, total, participants, params):
            return {}

    with pytest.raises(ValueError):
        register(Again)


def test_equal_split_gives_leftover_to_first_participants():
    parts = get_strategy("equal").split(Money(1000), ["a", "b", "c"])
    assert cents(parts) == {"a": 334, "b": 333, "c": 333}
    assert list(parts) == ["a", "b", "c"]
    assert cents(get_strategy("equal").split(Money(1001), ["a", "b", "c"])) == {"a": 334, "b": 334, "c": 333}


def test_equal_split_rejects_params():
    with pytest.raises(SplitError):
        get_strategy("equal").split(Money(100), ["a"], {"a": "1"})


def test_split_checks_participants_and_amount():
    equal = get_strategy("equal")
    with pytest.raises(SplitError, match="at least one"):
        equal.split(Money(100), [])
    with pytest.raises(SplitError, match="repeat"):
        equal.split(Money(100), ["a", "b", "a"])
    with pytest.raises(SplitError, match="negative"):
        equal.split(Money(-100), ["a"])
    assert cents(equal.split(Money(0), ["a", "b"])) == {"a": 0, "b": 0}


def test_shares_split():
    shares = get_strategy("shares")
    assert cents(shares.split(Money(900), ["a", "b"], {"a": "2", "b": "1"})) == {"a": 600, "b": 300}
    assert cents(shares.split(Money(100), ["a", "b", "c"], {"a": "1", "b": "1", "c": "1"})) == {
        "a": 34,
        "b": 33,
        "c": 33,
    }
    assert cents(shares.split(Money(500), ["a", "b"], {"a": "0", "b": " 3 "})) == {"a": 0, "b": 500}
    assert cents(shares.split(Money(400), ["a", "b"], {"b": "1", "a": "3"})) == {"a": 300, "b": 100}


def test_shares_split_errors():
    shares = get_strategy("shares")
    with pytest.raises(SplitError, match="missing shares parameter for: b"):
        shares.split(Money(100), ["a", "b"], {"a": "1"})
    with pytest.raises(SplitError, match="non-participants: z"):
        shares.split(Money(100), ["a"], {"a": "1", "z": "1"})
    with pytest.raises(SplitError, match="a: not a whole number: '1.5'"):
        shares.split(Money(100), ["a"], {"a": "1.5"})
    with pytest.raises(SplitError, match="negative"):
        shares.split(Money(100), ["a", "b"], {"a": "-1", "b": "2"})
    with pytest.raises(SplitError, match="positive"):
        shares.split(Money(100), ["a", "b"], {"a": "0", "b": "0"})


def test_exact_split():
    exact = get_strategy("exact")
    parts = exact.split(Money(1000), ["a", "b"], {"a": "2.50", "b": "7.50"})
    assert cents(parts) == {"a": 250, "b": 750}
    assert cents(exact.split(Money(1000), ["a", "b"], {"a": "0", "b": "10"})) == {"a": 0, "b": 1000}


def test_exact_split_errors():
    exact = get_strategy("exact")
    with pytest.raises(SplitError, match="add up to 9.99 EUR, not 10.00 EUR"):
        exact.split(Money(1000), ["a", "b"], {"a": "2.49", "b": "7.50"})
    with pytest.raises(SplitError, match="add up to 10.01 EUR"):
        exact.split(Money(1000), ["a", "b"], {"a": "2.51", "b": "7.50"})
    with pytest.raises(SplitError, match="a: "):
        exact.split(Money(1000), ["a", "b"], {"a": "two", "b": "7.50"})
    with pytest.raises(SplitError, match="must not be negative"):
        exact.split(Money(1000), ["a", "b"], {"a": "-1", "b": "11"})


def test_percent_split():
    percent = get_strategy("percent")
    assert cents(percent.split(Money(1000), ["a", "b"], {"a": "60", "b": "40"})) == {"a": 600, "b": 400}
    parts = percent.split(Money(1001), ["a", "b"], {"a": "33.33", "b": "66.67"})
    assert cents(parts) == {"a": 334, "b": 667}
    parts = percent.split(Money(100), ["a", "b", "c"], {"a": "12.5", "b": "12.5", "c": "75"})
    assert cents(parts) == {"a": 13, "b": 12, "c": 75}
    assert cents(percent.split(Money(100), ["a", "b"], {"a": "0", "b": "100"})) == {"a": 0, "b": 100}


def test_percent_split_must_add_up_to_100():
    percent = get_strategy("percent")
    with pytest.raises(SplitError, match="add up to 99.99, not 100"):
        percent.split(Money(1000), ["a", "b"], {"a": "60", "b": "39.99"})
    with pytest.raises(SplitError, match="add up to 100.01"):
        percent.split(Money(1000), ["a", "b"], {"a": "60", "b": "40.01"})
    with pytest.raises(SplitError, match="negative"):
        percent.split(Money(1000), ["a", "b"], {"a": "110", "b": "-10"})


def test_parse_percent():
    assert parse_percent("a", "12.5") == 1250
    assert parse_percent("a", "100") == 10000
    assert parse_percent("a", "0.01") == 1
    with pytest.raises(SplitError, match="at most 2 decimals"):
        parse_percent("a", "0.001")
    with pytest.raises(SplitError, match="not a percentage"):
        parse_percent("a", "half")


def test_split_checks_that_parts_add_up():
    class Broken(SplitStrategy):
        name = "broken"
        requires_params = False

        def compute(self, total, participants, params):
            return {p: Money(1, total.currency) for p in participants}

    with pytest.raises(SplitError, match="do not add up"):
        Broken().split(Money(100), ["a", "b"])
    assert cents(Broken().split(Money(2), ["a", "b"])) == {"a": 1, "b": 1}
