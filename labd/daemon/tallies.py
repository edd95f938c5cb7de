"""Counters and histograms that only the event loop's thread changes: what the daemon counts
on every reconfiguration (docs/daemon.md "Metrics").

prometheus_client's own take a lock per value and walk the buckets one by one on every
observation; a reconfiguration observes five spans and a count, and that was a tenth of the
loop's time at thousands of reconfigurations a second. These keep plain integers, find a
bucket by bisection and are exposed, at scrape time, as the same families (a scrape runs on
a worker thread: it copies what it reads, and a figure changed meanwhile is the next
scrape's, as with the library's own).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["LoopCounter", "LoopHistogram"]


class _Bins:
    """One label set's observations: a count per bucket (not cumulative) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # A bucket holds what is at most its bound ("le"): the first bound not below it.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Count:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class _Family(Collector):
    """A named family with labels; its children by label values, made on first use."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None) -> None:
        self.name, self.documentation = name, documentation
        self.labelnames = list(labelnames)
        if registry is not None:
            registry.register(self)

    def _values(self, values: tuple[object, ...]) -> tuple[str, ...]:
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name} takes the labels {self.labelnames}, "
                             f"given {len(values)} value(s)")
        return tuple(str(v) for v in values)


class LoopHistogram(_Family):
    """A histogram (``labels(...).observe(seconds)``), exposed as prometheus_client's."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], *,
                 buckets: Sequence[float], registry: CollectorRegistry | None = None) -> None:
        super().__init__(name, documentation, labelnames, registry)
        self.bounds = tuple(sorted(float(b) for b in buckets if b != float("inf")))
        self._children: dict[tuple[str, ...], _Bins] = {}

    def labels(self, *values: object) -> _Bins:
        key = self._values(values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = _Bins(self.bounds)
        return child

    def collect(self) -> Iterable[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation,
                                       labels=self.labelnames)
        edges = [*(floatToGoString(b) for b in self.bounds), "+Inf"]  # type: ignore[no-untyped-call]
        for key, child in tuple(self._children.items()):
            counts, total = list(child.counts), child.sum
            cumulative, running = [], 0
            for edge, count in zip(edges, counts, strict=True):
                running += count
                cumulative.append((edge, float(running)))
            family.add_metric(list(key), cumulative, total)
        yield family


class LoopCounter(_Family):
    """A counter (``labels(...).inc()``); ``name`` without ``_total``, as the library's."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str], *,
                 registry: CollectorRegistry | None = None) -> None:
        super().__init__(name, documentation, labelnames, registry)
        self._children: dict[tuple[str, ...], _Count] = {}

    def labels(self, *values: object) -> _Count:
        key = self._values(values)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = _Count()
        return child

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for key, child in tuple(self._children.items()):
            family.add_metric(list(key), child.value)
        yield family
