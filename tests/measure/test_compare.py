"""``labd measure compare`` holds a difference against the run-to-run variation, not only
the spread within each run, and fits 80 columns. The rows are built, not timed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from labd.measure.reports import compare_table
from labd.measure.stats import compare_values, run_to_run
from tests.commands.test_cli import run
from tests.measure.test_reports import a_run, cells, change, interval, kept, verdict


def drawn(seed: int, n: int, *, centre: float, step: float = 0.0, sd: float = 0.05
          ) -> list[dict[str, Any]]:
    """``n`` changes of one set-up: device times around ``centre`` ms; from halfway on,
    ``step`` ms more (the machine's load changed during the run)."""
    values = np.random.default_rng(seed).normal(centre, sd, n)
    return [change(i, device_ms=float(v) + (step if i >= n // 2 else 0.0), truth_ms=centre)
            for i, v in enumerate(values)]


def compared(a: list[dict[str, Any]], b: list[dict[str, Any]], *, width: int = 80,
             repeats_a: list[list[dict[str, Any]]] = (), repeats_b: list[list[dict[str, Any]]]
             = ()) -> str:  # type: ignore[assignment]
    console = Console(width=width, record=True)
    console.print(compare_table(
        a_run("a"), a, a_run("b"), b,
        repeats_a=[(a_run(f"a{i + 2}"), rows) for i, rows in enumerate(repeats_a)],
        repeats_b=[(a_run(f"b{i + 2}"), rows) for i, rows in enumerate(repeats_b)]))
    return console.export_text()


def device(rows: list[dict[str, Any]]) -> list[float]:
    return [(r["phases"]["acknowledged"] - r["phases"]["dispatched"]) / 1e6 for r in rows]


def test_two_draws_of_one_set_up_are_within_noise_and_5_ms_apart_is_slower() -> None:
    same = compared(drawn(1, 200, centre=25.0), drawn(2, 200, centre=25.0))
    assert verdict(same, "ocs1", "device p50") == "noise"
    slower = compared(drawn(1, 200, centre=25.0), drawn(2, 200, centre=30.0))
    assert verdict(slower, "ocs1", "device p50") == "slower"
    low, high = interval(slower, "ocs1", "device p50")
    assert 4.9 < low <= high < 5.1
    faster = compared(drawn(2, 200, centre=30.0), drawn(1, 200, centre=25.0))
    assert verdict(faster, "ocs1", "device p50") == "faster"


def test_load_that_moves_within_each_run_is_noise_not_a_verdict() -> None:
    """The same set-up twice, each run's second half 0.9 ms slower (load came and went):
    0.8 ms apart at the median, with an interval clear of zero. Held only against the
    spread within each run it would be called slower; the halves show the variation."""
    a, b = drawn(1, 200, centre=25.0, step=0.9), drawn(2, 200, centre=25.8, step=0.9)
    bare = compare_values(device(a), device(b), 50)
    assert bare.direction == 1 and bare.low is not None and bare.low > 0  # what it was
    spread = run_to_run([device(a)], 50)
    assert spread is not None and 0.85 < spread < 0.95
    assert verdict(compared(a, b), "ocs1", "device p50") == "noise"


def test_repeats_give_the_run_to_run_variation() -> None:
    """Load steady within each run but not between runs: repeats of each set-up show it."""
    a1, a2 = drawn(1, 200, centre=25.0), drawn(3, 200, centre=25.9)
    b1, b2 = drawn(2, 200, centre=25.8), drawn(4, 200, centre=26.7)
    assert verdict(compared(a1, b1), "ocs1", "device p50") == "slower"  # one of each: no way
    repeated = compared(a1, b1, repeats_a=[a2], repeats_b=[b2])
    assert verdict(repeated, "ocs1", "device p50") == "noise"
    assert "a +1" in repeated and "between repeats" in " ".join(repeated.split())
    # A real difference stays one through repeats.
    c1, c2 = drawn(5, 200, centre=30.0), drawn(6, 200, centre=30.9)
    assert verdict(compared(a1, c1, repeats_a=[a2], repeats_b=[c2]), "ocs1",
                   "device p50") == "slower"


def test_the_table_fits_80_columns_one_line_a_figure() -> None:
    out = compared(drawn(1, 200, centre=25.0), drawn(2, 200, centre=30.0))
    assert all(len(line) <= 80 for line in out.splitlines())
    rows = [r for r in cells(out) if r[0] == "ocs1"]
    lines = [line for line in out.splitlines() if line.startswith("│ ocs1 ")]
    assert len(rows) == len(lines) >= 6  # no figure wraps onto a second line


async def test_compare_takes_repeats_after_commas(tmp_path: Path) -> None:
    runs = tmp_path / "runs.sqlite"
    for name, centre, seed in (("a1", 25.0, 1), ("a2", 25.9, 3), ("b1", 25.8, 2),
                               ("b2", 26.7, 4)):
        kept(runs, name, drawn(seed, 200, centre=centre), None)
    code, out, err = await run("measure", "compare", "a1,a2", "b1,b2", "--runs", str(runs))
    assert code == 0, out + err
    assert verdict(out, "ocs1", "device p50") == "noise"
    code, out, err = await run("measure", "compare", "a1", "b1", "--runs", str(runs))
    assert code == 0 and verdict(out, "ocs1", "device p50") == "slower", out + err
    code, out, err = await run("measure", "compare", "a1,nosuch", "b1", "--runs", str(runs))
    assert code == 2 and "no run 'nosuch'" in out + err and "Traceback" not in out + err


def test_a_sweeps_batch_sizes_are_not_taken_for_noise() -> None:
    """A sweep measures k = 1 then k = 16: halves of the pooled run would differ by the
    batch's own effect (5 ms here). The halves are taken batch size by batch size, so B,
    1 ms slower at every size, is slower."""
    def sweep(seed: int, extra: float) -> list[dict[str, Any]]:
        values = np.random.default_rng(seed).normal(0.0, 0.05, 400)
        return [change(i, device_ms=(25.0 if i < 200 else 30.0) + extra + float(v),
                       truth_ms=25.0 if i < 200 else 30.0, k=1 if i < 200 else 16)
                for i, v in enumerate(values)]

    a, b = sweep(1, 0.0), sweep(2, 1.0)
    # Pooled, the p99 lies in the k = 16 group: its halves are alike, B is slower. (The
    # pooled median falls between the two sizes, and its interval says nothing.)
    assert verdict(compared(a, b), "ocs1", "device p99") == "slower"
    console = Console(width=120, record=True)
    console.print(compare_table(a_run("a"), a, a_run("b"), b, full=True))
    rows = [row for row in cells(console.export_text())
            if row[0] == "ocs1" and row[2] in ("device p50", "device p99")]
    assert len(rows) == 4 and all(row[-1] == "slower" for row in rows), rows
