import pytest
from ledger.errors import CurrencyMismatchError, ValidationError
from ledger.money import Money, currency_decimals, sum_money


def eur(text: str) -> Money:
    return Money.parse(text, "EUR")


def test_parse_whole_and_fractional_amounts():
    assert eur("12").cents == 1200
    assert eur("12.5").cents == 1250
    assert eur("12.05").cents == 1205
    assert eur("0.01").cents == 1
    assert eur(" 7.10 ").cents == 710


def test_parse_signs():
    assert eur("-3.25").cents == -325
    assert eur("+3.25").cents == 325
    assert eur("-0.05").cents == -5


def test_parse_error_messages():
    with pytest.raises(ValidationError, match="too many decimals for EUR: '12.345'"):
        eur("12.345")
    with pytest.raises(ValidationError, match="not an amount: '1,50'"):
        eur("1,50")


def test_parse_zero_decimal_currency():
    assert Money.parse("1200", "JPY").cents == 1200
    with pytest.raises(ValidationError):
        Money.parse("1200.5", "JPY")


def test_parse_rejects_malformed_amounts():
    for text in ("", "abc", "1.2.3", "1,50", "1.", ".5", "12.345", "--1"):
        with pytest.raises(ValidationError) as info:
            eur(text)
        assert info.value.field == "amount", text


def test_unsupported_currency():
    with pytest.raises(ValidationError) as info:
        Money(100, "XYZ")
    assert info.value.field == "currency"
    assert currency_decimals("JPY") == 0
    assert currency_decimals("USD") == 2


def test_cents_must_be_an_integer():
    with pytest.raises(ValidationError):
        Money(1.5)  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        Money(True)  # type: ignore[arg-type]


def test_arithmetic():
    assert eur("1.50") + eur("2.25") == eur("3.75")
    assert eur("1.50") - eur("2.25") == eur("-0.75")
    assert -eur("1.50") == eur("-1.50")
    assert abs(eur("-1.50")) == eur("1.50")
    assert eur("1.50") * 3 == eur("4.50")
    assert 3 * eur("1.50") == eur("4.50")
    with pytest.raises(TypeError):
        eur("1.50") * 1.5  # type: ignore[operator]


def test_mixing_currencies_fails():
    with pytest.raises(CurrencyMismatchError) as info:
        Money(100, "EUR") + Money(100, "USD")
    assert (info.value.left, info.value.right) == ("EUR", "USD")
    with pytest.raises(CurrencyMismatchError):
        _ = Money(100, "EUR") < Money(100, "USD")
    with pytest.raises(TypeError):
        Money(100) + 1  # type: ignore[operator]


def test_comparisons_and_predicates():
    assert eur("1.00") < eur("1.01")
    assert not eur("1.01") < eur("1.01")
    assert eur("1.01") <= eur("1.01")
    assert eur("2") > eur("1.99")
    assert eur("0").is_zero() and not eur("0.01").is_zero()
    assert eur("0.01").is_positive() and not eur("0").is_positive()
    assert eur("-0.01").is_negative() and not eur("0").is_negative()


def test_allocate_distributes_leftover_by_largest_remainder():
    parts = eur("1.00").allocate([1, 1, 1])
    assert [p.cents for p in parts] == [34, 33, 33]
    parts = eur("0.05").allocate([3, 7])
    assert [p.cents for p in parts] == [2, 3]  # 1.5 and 3.5: the tie goes to the first
    parts = eur("0.05").allocate([7, 3])
    assert [p.cents for p in parts] == [4, 1]
    parts = eur("10.00").allocate([1, 2, 2])
    assert [p.cents for p in parts] == [200, 400, 400]
    parts = Money(10).allocate([1, 1, 1, 3])
    assert [p.cents for p in parts] == [2, 2, 1, 5]


def test_allocate_keeps_total_and_handles_zero_weights():
    parts = Money(1001).allocate([3333, 6667])
    assert [p.cents for p in parts] == [334, 667]
    assert sum(p.cents for p in parts) == 1001
    assert [p.cents for p in Money(100).allocate([0, 1])] == [0, 100]


def test_allocate_negative_amounts():
    parts = Money(-100).allocate([1, 1, 1])
    assert [p.cents for p in parts] == [-34, -33, -33]


def test_allocate_rejects_bad_weights():
    for weights in ([], [0, 0], [1, -1]):
        with pytest.raises(ValidationError):
            Money(100).allocate(weights)


def test_split_evenly():
    assert [p.cents for p in Money(7).split_evenly(3)] == [3, 2, 2]
    assert [p.cents for p in Money(7).split_evenly(1)] == [7]
    with pytest.raises(ValidationError):
        Money(7).split_evenly(0)


def test_formatting():
    assert str(eur("12.5")) == "12.50 EUR"
    assert eur("-0.05").amount_str() == "-0.05"
    assert Money(0).amount_str() == "0.00"
    assert Money(0, "JPY").amount_str() == "0"
    assert eur("1234.56").amount_str() == "1234.56"
    assert Money(100000, "JPY").amount_str() == "100000"
    assert str(Money(-7, "JPY")) == "-7 JPY"


def test_sum_money():
    assert sum_money([]) == Money(0)
    assert sum_money([], "USD") == Money(0, "USD")
    assert sum_money([eur("1.10"), eur("2.20"), eur("-0.30")]) == eur("3.00")
    with pytest.raises(CurrencyMismatchError):
        sum_money([Money(1, "USD")], "EUR")
