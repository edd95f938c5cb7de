"""The one limiter for repeated lines (labd.repeats): per key, overall, bounded whatever
keys a sender makes up, and honest about what it held back."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from labd.repeats import Repeats


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_key_then_the_count_of_those_held_back() -> None:
    clock = Clock()
    repeats = Repeats(10.0, clock=clock)
    first = repeats.tell("host h1")
    assert first is not None and first.suffix() == ""
    assert [repeats.tell("host h1") for _ in range(5)] == [None] * 5
    assert repeats.tell("host h2") is not None  # another key is told at once
    clock.now = 10.0
    again = repeats.tell("host h1")
    assert again is not None and again.held == 5
    assert again.suffix() == " (5 more like it since the last one)"
    assert (repeats.told, repeats.held) == (3, 5)


def test_the_overall_budget_holds_a_flood_of_new_keys_and_says_so() -> None:
    clock = Clock()
    repeats = Repeats(10.0, overall=3, clock=clock)
    told = [repeats.tell(f"host h{i}") for i in range(100)]
    assert sum(t is not None for t in told) == 3
    clock.now = 10.0
    after = repeats.tell("host h500")
    assert after is not None and after.held_overall == 97
    assert "97 other lines held back" in after.suffix()


@given(st.lists(st.text(max_size=8), max_size=300), st.integers(1, 16))
def test_memory_is_bounded_whatever_the_keys(keys: list[str], most: int) -> None:
    clock = Clock()
    repeats = Repeats(1.0, overall=1000, keys=most, clock=clock)
    for i, key in enumerate(keys):
        clock.now = i * 0.1
        repeats.tell(key)
        assert len(repeats._keys) <= most
    assert repeats.told + repeats.held == len(keys)
