"""One percentile for every report: the API's statistics, the TUI's latency table and
``labd measure``'s summaries give the same p50/p99 on the same data, and the one definition
they (and the benchmarks) share is numpy's default (linear)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from labd.daemon.api.reconfigurations import span_stats
from labd.measure.campaign import summary
from labd.vocabulary import PHASES, SPANS, percentile, span_ns
from tui.tabs.reconfigurations import latency_rows, record


@pytest.mark.parametrize("n", [1, 2, 3, 5, 12, 100, 1001])
def test_percentile_is_numpys_linear_definition(n: int) -> None:
    rng = random.Random(n)
    values = [rng.lognormvariate(3, 1) for _ in range(n)]
    for q in (0, 1, 50, 90, 99, 99.9, 100):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)),
                                                      rel=1e-12, abs=1e-12)
    assert np.isnan(percentile([], 50))


def history(count: int, seed: int) -> list[dict[str, object]]:
    """Reconfiguration rows as the API lists them: one switch, phases in ns."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        at = rng.randrange(10**12)
        phases: dict[str, int | None] = {}
        for phase in PHASES:
            at += rng.randrange(1, 5_000_000)
            phases[phase] = at
        if rng.random() < 0.3:
            phases["light"] = None  # no meter on its path
        rows.append({"switch": "ocs1", "k": 1, "outcome": "ok", "phases": phases})
    return rows


def test_every_report_gives_the_same_p50_and_p99() -> None:
    rows = history(37, seed=7)
    expected = {}
    for name, start, end in SPANS:
        values = [d / 1e6 for r in rows if (d := span_ns(r["phases"], start, end)) is not None]
        expected[f"{name} p50"] = float(np.percentile(values, 50))
        expected[f"{name} p99"] = float(np.percentile(values, 99))

    # labd measure's summary
    measured = {f"{s['span']} p{q}": s[f"p{q}"] for s in summary(rows) for q in (50, 99)}
    assert measured == pytest.approx(expected)

    # the API's GET /v1/reconfigurations/stats
    stats = span_stats(rows)["ocs1"]
    assert {f"{name} p{q}": stats[name][f"p{q}_ms"] for name, _, _ in SPANS for q in (50, 99)} \
        == pytest.approx(expected)

    # the TUI's latency table (figures shown to two decimals)
    phase_ms: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        record(phase_ms, row)
    shown = {f"{name} p{q}": float(value) for _, name, _, p50, p99, *_ in latency_rows(phase_ms)
             for q, value in ((50, p50), (99, p99))}
    assert shown == pytest.approx(expected, abs=0.005)
