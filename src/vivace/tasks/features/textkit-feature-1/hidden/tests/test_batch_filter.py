import pytest

from textkit import FilterError, Template, TemplateSyntaxError, default_filters, render
from textkit.context import Undefined


def batch(value, *args):
    return default_filters.apply("batch", value, args)


def test_batch_splits_into_groups():
    assert batch([1, 2, 3, 4, 5, 6, 7], 3) == [[1, 2, 3], [4, 5, 6], [7]]
    assert batch([1, 2, 3, 4, 5, 6], 3) == [[1, 2, 3], [4, 5, 6]]
    assert batch([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]
    assert batch(["a", "b"], 5) == [["a", "b"]]
    assert batch(["a", "b", "c"], 1) == [["a"], ["b"], ["c"]]
    assert batch([], 4) == []


def test_batch_accepts_any_iterable_and_returns_lists():
    assert batch((1, 2, 3), 2) == [[1, 2], [3]]
    assert batch(iter("abcde"), 2) == [["a", "b"], ["c", "d"], ["e"]]
    assert batch(range(4), 3) == [[0, 1, 2], [3]]
    groups = batch((1, 2, 3, 4), 2)
    assert all(type(group) is list for group in groups)


def test_batch_does_not_change_its_input():
    items = [1, 2, 3]
    assert batch(items, 2, 0) == [[1, 2], [3, 0]]
    assert items == [1, 2, 3]


def test_batch_fill_pads_the_last_group():
    assert batch([1, 2, 3, 4, 5], 3, 0) == [[1, 2, 3], [4, 5, 0]]
    assert batch([1, 2, 3, 4], 3, "-") == [[1, 2, 3], [4, "-", "-"]]
    assert batch([1], 4, "x") == [[1, "x", "x", "x"]]
    assert batch([1, 2, 3, 4], 2, 0) == [[1, 2], [3, 4]]
    assert batch([], 3, 0) == []


def test_batch_in_templates():
    source = "{% for row in cells | batch(3, '.') %}{{ row | join(' ') }}|{% endfor %}"
    assert render(source, cells=["a", "b", "c", "d", "e"]) == "a b c|d e .|"
    assert render(source, cells=["a", "b", "c"]) == "a b c|"
    assert render(source, cells=[]) == ""
    grid = Template("{% for row in xs | batch(2) %}[{% for x in row %}{{ x }}{% endfor %}]{% endfor %}")
    assert grid.render(xs=[1, 2, 3]) == "[12][3]"
    assert render("{{ xs | batch(2) | length }}", xs=[1, 2, 3, 4, 5]) == "3"
    assert render("{{ (xs | batch(2) | last) | join(',') }}", xs=[1, 2, 3, 4, 5]) == "5"


def test_batch_is_a_registered_filter_taking_one_or_two_arguments():
    assert "batch" in default_filters
    spec = default_filters.get("batch")
    assert (spec.min_args, spec.max_args) == (1, 2)
    assert "batch" in default_filters.names()
    with pytest.raises(TemplateSyntaxError) as info:
        Template("ok\n{{ xs | batch }}")
    assert info.value.lineno == 2
    assert info.value.message == "filter 'batch' takes 1 to 2 arguments, got 0"
    with pytest.raises(TemplateSyntaxError, match="filter 'batch' takes 1 to 2 arguments, got 3"):
        Template("{{ xs | batch(1, 2, 3) }}")


@pytest.mark.parametrize("size", [0, -1, -5])
def test_batch_rejects_sizes_below_one(size):
    with pytest.raises(FilterError) as info:
        batch([1, 2, 3], size)
    assert info.value.message.startswith("batch: ")
    assert "at least 1" in info.value.message


@pytest.mark.parametrize("size", ["2", 2.0, True, None])
def test_batch_rejects_non_integer_sizes(size):
    with pytest.raises(FilterError) as info:
        batch([1, 2, 3], size)
    assert info.value.message.startswith("batch: ")


def test_batch_rejects_values_that_are_not_lists():
    for value in ("abc", {"a": 1}, 5, None):
        with pytest.raises(FilterError) as info:
            batch(value, 2)
        assert info.value.message.startswith("batch: ")
    assert batch(Undefined("xs"), 2) == []


def test_batch_errors_in_templates_name_the_line():
    template = Template("a\n\n{{ xs | batch(n) }}", name="grid.txt")
    with pytest.raises(FilterError) as info:
        template.render(xs=[1, 2], n=0)
    assert info.value.lineno == 3
    assert str(info.value).startswith("grid.txt, line 3: batch: ")
    with pytest.raises(FilterError) as info:
        Template("{{ s | batch(2) }}").render(s="text")
    assert info.value.lineno == 1
