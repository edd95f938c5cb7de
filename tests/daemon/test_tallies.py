"""The loop's own counters and histograms (labd.daemon.tallies) expose exactly what
prometheus_client's own would for the same observations: the same text, byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from labd.daemon.metrics import SECONDS_BUCKETS
from labd.daemon.tallies import LoopCounter, LoopHistogram

LABELS = st.sampled_from([("s1", "device"), ("s1", "total"), ("s2", "device")])
#: Values on the bucket bounds themselves included: a bound holds what equals it ("le").
SECONDS = st.one_of(st.sampled_from(SECONDS_BUCKETS), st.floats(0, 20, allow_nan=False))


@given(st.lists(st.tuples(LABELS, SECONDS), max_size=60))
def test_a_histogram_exposes_what_the_librarys_would(
        observed: list[tuple[tuple[str, str], float]]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    library = Histogram("x_seconds", "help", ["switch", "phase"], buckets=SECONDS_BUCKETS,
                        registry=theirs)
    loop = LoopHistogram("x_seconds", "help", ["switch", "phase"], buckets=SECONDS_BUCKETS,
                         registry=ours)
    for labels, seconds in observed:
        library.labels(*labels).observe(seconds)
        loop.labels(*labels).observe(seconds)
    assert generate_latest(ours) == generate_latest(theirs)


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.sampled_from(["ok", "failed"])),
                max_size=30))
def test_a_counter_exposes_what_the_librarys_would(observed: list[tuple[str, str]]) -> None:
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    library = Counter("x", "help", ["switch", "outcome"], registry=theirs)
    loop = LoopCounter("x", "help", ["switch", "outcome"], registry=ours)
    for labels in observed:
        library.labels(*labels).inc()
        loop.labels(*labels).inc()
    assert generate_latest(ours) == generate_latest(theirs)


def test_the_wrong_number_of_label_values_is_refused_by_name() -> None:
    loop = LoopHistogram("x_seconds", "help", ["switch", "phase"], buckets=(1.0,))
    with pytest.raises(ValueError, match=r"x_seconds takes the labels \['switch', 'phase'\]"):
        loop.labels("s1")
