import pytest

from textkit.text import count_words, fill, indent, normalize_whitespace, slugify, truncate, wrap


def test_wrap_exact_fit():
    assert wrap("aaa bbb", 7) == ["aaa bbb"]
    assert wrap("aaa bbb", 6) == ["aaa", "bbb"]
    assert wrap("a b c d", 3) == ["a b", "c d"]


def test_wrap_collapses_whitespace():
    assert wrap("  one\n two   three  ", 9) == ["one two", "three"]
    assert wrap("", 5) == []
    assert wrap("   ", 5) == []


def test_wrap_long_words():
    assert wrap("abcdefgh", 3) == ["abc", "def", "gh"]
    assert wrap("x abcdef y", 3) == ["x", "abc", "def", "y"]
    assert wrap("abcdef", 3) == ["abc", "def"]
    assert wrap("ab abcdefg c", 4, break_long_words=False) == ["ab", "abcdefg", "c"]
    assert wrap("abc d", 4) == ["abc", "d"]


def test_wrap_rejects_bad_width():
    with pytest.raises(ValueError, match="width must be at least 1"):
        wrap("a", 0)
    assert wrap("a b", 1) == ["a", "b"]


def test_fill():
    assert fill("the quick brown fox", 10) == "the quick\nbrown fox"


def test_truncate():
    assert truncate("hello", 5) == "hello"
    assert truncate("hello!", 5) == "he..."
    assert truncate("hello world", 8, "") == "hello wo"
    assert truncate("abc", 3, "...") == "abc"
    assert truncate("abcd", 3, "...") == "..."
    assert truncate("ab cd", 4, ".") == "ab."


def test_truncate_whole_words():
    assert truncate("the quick brown fox", 15, whole_words=True) == "the quick..."
    assert truncate("the quick brown fox", 12, whole_words=True) == "the quick..."
    assert truncate("the quick brown fox", 13, whole_words=True) == "the quick..."
    assert truncate("the quick brown fox", 16, whole_words=True) == "the quick..."
    assert truncate("the quick brown fox", 17, whole_words=True) == "the quick..."
    assert truncate("the quick brown fox", 18, whole_words=True) == "the quick brown..."
    assert truncate("abcdefghij", 6, whole_words=True) == "abc..."
    assert truncate("a bcdefghij", 7, whole_words=True) == "a..."
    assert truncate(" abcdefgh", 6, whole_words=True) == " ab..."


def test_truncate_rejects_length_below_suffix():
    with pytest.raises(ValueError, match="shorter than the suffix"):
        truncate("abcdef", 2)
    assert truncate("abcdef", 3) == "..."


def test_slugify():
    assert slugify("Hello, World!") == "hello-world"
    assert slugify("  Crème brûlée  à la carte ") == "creme-brulee-a-la-carte"
    assert slugify("snake case", sep="_") == "snake_case"
    assert slugify("!!!") == ""
    assert slugify("Version 2.0") == "version-2-0"


def test_slugify_max_length():
    assert slugify("alpha beta gamma", max_length=10) == "alpha-beta"
    assert slugify("alpha beta gamma", max_length=9) == "alpha"
    assert slugify("alpha beta gamma", max_length=16) == "alpha-beta-gamma"
    assert slugify("alpha beta gamma", max_length=15) == "alpha-beta"
    assert slugify("supercalifragilistic", max_length=5) == "super"
    assert slugify("ab cd", max_length=0) == ""


def test_indent():
    assert indent("a\nb\n\nc") == "a\n    b\n\n    c"
    assert indent("a\nb", 2, first=True) == "  a\n  b"
    assert indent("a", 3) == "a"
    assert indent("a\n  \nb", 1) == "a\n  \n b"


def test_normalize_whitespace_and_count_words():
    assert normalize_whitespace("  a \t b\n\nc ") == "a b c"
    assert count_words("") == 0
    assert count_words(" one  two\nthree ") == 3
