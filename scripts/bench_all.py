#!/usr/bin/env python3
"""Every benchmark in one command: one summary table, each figure beside its target.

Runs scripts/bench_switch.py, bench_daemon.py, bench_mesh.py, bench_heal.py and
bench_light.py one after another, each in a process of its own with ``--json`` (the
baselines stay interleaved inside each: raw socket against the driver, a direct driver call
against the API), then prints one table of their figures with their targets and
writes the results as JSON (``--out``, default ``bench.json``): the machine's description,
the commit measured and the UTC date, every benchmark's figures and the verdicts.

``--against FILE`` sets a previous results file beside this run (columns "before" and
"change"; each change says whether it is better or worse). ``--docs`` regenerates the
summary section of docs/benchmarks.md (``--docs-file``) between its marker lines;
``--from FILE`` renders a results file written earlier instead of running the benchmarks.
A missed target is reported, not a failure: the exit code is 0 unless ``--check`` is
given (1 if a target is missed), 1 if a benchmark failed, 2 for bad input.

Usage: python scripts/bench_all.py [--quick] [--only NAME,...] [--out FILE] [--against FILE]
                                   [--docs] [--docs-file FILE] [--from FILE] [--check]
                                   [--verbose]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import operator
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from labd.runtime import loop_factory

ROOT = Path(__file__).resolve().parents[1]
#: The version of the results file's layout; --against refuses any other.
SCHEMA = 1
BEGIN = "<!-- bench_all:begin -->"
END = "<!-- bench_all:end -->"
#: A benchmark that runs longer than this is stopped and reported as failed.
BENCH_TIMEOUT_S = 1800

#: A results file, as written to --out and read by --against and --from.
Results = dict[str, Any]


@dataclass(frozen=True)
class Benchmark:
    name: str
    #: The default sizes: each script's own defaults, so that the figures compare with the
    #: runs of the scripts alone in docs/benchmarks.md (about a minute in all on 2 cores).
    sizes: tuple[str, ...]
    #: Small sizes for a smoke run (the tests): seconds each, figures not for comparison.
    quick: tuple[str, ...]


BENCHMARKS = (
    Benchmark("bench_switch", ("--rounds", "10", "--per-round", "200", "--replacements", "30"),
              ("--rounds", "2", "--per-round", "50", "--replacements", "5")),
    Benchmark("bench_daemon", ("--samples", "300", "--rows", "100000", "--seconds", "5"),
              ("--samples", "30", "--rows", "3000", "--seconds", "1")),
    Benchmark("bench_mesh", ("--perm8", "200", "--perm16", "50"),
              ("--perm8", "10", "--perm16", "3")),
    Benchmark("bench_heal", ("--cycles", "20", "--commands", "400"),
              ("--cycles", "2", "--commands", "20")),
    Benchmark("bench_light", ("--events", "100"), ("--events", "10")),
)

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, "<": operator.lt, ">=": operator.ge, ">": operator.gt, "==": operator.eq}
SYMBOLS = {"<=": "≤", "<": "<", ">=": "≥", ">": ">", "==": "="}
#: The unit of a ratio, and what stands for no figure or no target (by code point: the
#: linter takes both for look-alikes of x and -).
TIMES, DASH = "\u00d7", "\u2013"


@dataclass(frozen=True)
class Target:
    op: str
    value: float | None = None
    #: Another figure of the same benchmark to compare with, instead of a fixed value.
    ref: str | None = None
    #: A tighter goal beyond the target, reported beside the verdict.
    stretch: float | None = None


@dataclass(frozen=True)
class Figure:
    benchmark: str
    key: str
    label: str
    unit: str
    #: Which way is better, for --against: "lower", "higher", or None (no direction).
    better: str | None
    target: Target | None = None


def _figures(benchmark: str, rows: Sequence[tuple[Any, ...]]) -> list[Figure]:
    return [Figure(benchmark, *row) for row in rows]


#: The figures of the summary table, in its order, with their targets. Each
#: script's JSON holds a few more (counts, sizes); they go into the results file as well.
FIGURES = (
    _figures("bench_switch", [
        ("ratio_p50", "driver / raw socket round trip, p50", TIMES, "lower",
         Target("<=", 1.3, stretch=1.15)),
        ("ratio_p99", "driver / raw socket round trip, p99", TIMES, "lower"),
        ("floor_ratio_p50", "bare event-loop client / raw socket, p50", TIMES, "lower"),
        ("driver_floor_ratio_p50", "driver / bare event-loop client, p50", TIMES, "lower"),
        ("raw_p50_us", "raw socket connect round trip, p50", "µs", "lower"),
        ("raw_p99_us", "raw socket connect round trip, p99", "µs", "lower"),
        ("driver_p50_us", "driver connect round trip, p50", "µs", "lower"),
        ("driver_p99_us", "driver connect round trip, p99", "µs", "lower"),
        ("replace_wall_p50_ms", "384-pair replace(), wall time p50", "ms", "lower"),
        ("replace_own_p50_ms", "384-pair replace(), labd's own p50", "ms", "lower",
         Target("<", 2.0)),
        ("replace_own_p99_ms", "384-pair replace(), labd's own p99", "ms", "lower"),
    ])
    + _figures("bench_daemon", [
        ("api_added_p50_ms", "API added over a direct call, p50", "ms", "lower",
         Target("<=", 0.5)),
        ("api_added_p99_ms", "API added over a direct call, p99", "ms", "lower"),
        ("direct_p50_us", "direct driver connect, p50", "µs", "lower"),
        ("api_p50_us", "API connect (raw-socket client), p50", "µs", "lower"),
        ("store_rows_per_s", "SQLite store, records committed", "rows/s", "higher",
         Target(">=", 40_000)),
        ("lag_p50_ms", "event-loop lag during the store run, p50", "ms", "lower"),
        ("lag_p99_ms", "event-loop lag during the store run, p99", "ms", "lower",
         Target("<", 2.0)),
        ("fleet_per_s", "8 switches at once through the engine", "reconf/s", "higher",
         Target(">=", 8_000)),
        # Counts of records: how many the run made depends on the machine's speed.
        ("truth_inside", "records with the true change inside their window", "records", None,
         Target("==", ref="truth_total")),
        ("truth_total", "records of the 8-switch run", "records", None),
        ("after_settle_p50_ms", "acknowledged after the device settled, p50", "ms", "lower"),
        # The same fleet with the daemon's loop held on one CPU (labd run --cpu auto).
        ("fleet_one_cpu_per_s", "8 switches, the loop held on one CPU (--cpu auto)",
         "reconf/s", "higher", Target(">=", 8_000)),
        ("fleet_one_cpu_truth_inside", "records of it with the true change inside their window",
         "records", None, Target("==", ref="fleet_one_cpu_truth_total")),
        ("fleet_one_cpu_truth_total", "records of the 8-switch run on one CPU", "records",
         None),
    ])
    + _figures("bench_mesh", [
        ("mesh8_p50_ms", "8x8 full reconfiguration, p50", "ms", "lower"),
        ("mesh8_p99_ms", "8x8 full reconfiguration, p99", "ms", "lower"),
        ("mesh8_bytes_p50", "8x8 bytes on the line both ways, p50", "bytes", "lower"),
        ("mesh8_wire_ms", "8x8 those bytes at 115200 baud", "ms", "lower"),
        ("mesh8_rest_p50_ms", "8x8 the rest above wire and settle, p50", "ms", "lower",
         Target("<=", 1.0)),
        ("mesh8_rest_p99_ms", "8x8 the rest above wire and settle, p99", "ms", "lower"),
        ("mesh8_crosstalk_worst_db", "8x8 worst crosstalk", "dB", "lower"),
        ("mesh16_p50_ms", "16x16 full reconfiguration, p50", "ms", "lower"),
        ("mesh16_p99_ms", "16x16 full reconfiguration, p99", "ms", "lower"),
        ("mesh16_bytes_p50", "16x16 bytes on the line both ways, p50", "bytes", "lower"),
        ("mesh16_wire_ms", "16x16 those bytes at 115200 baud", "ms", "lower"),
        ("mesh16_rest_p50_ms", "16x16 the rest above wire and settle, p50", "ms", "lower"),
        ("mesh16_crosstalk_worst_db", "16x16 worst crosstalk", "dB", "lower"),
    ])
    + _figures("bench_heal", [
        ("off_to_offline_p50_ms", "power off → marked offline, p50", "ms", "lower"),
        ("off_to_offline_p99_ms", "power off → marked offline, p99", "ms", "lower"),
        ("on_to_back_p50_ms", "power on → circuits back, p50", "ms", "lower"),
        ("on_to_back_p99_ms", "power on → circuits back, p99", "ms", "lower"),
        ("off_to_back_p50_ms", "power off → circuits back, p50", "ms", "lower"),
        ("off_to_back_p99_ms", "power off → circuits back, p99", "ms", "lower"),
        ("connect_watch_off_p50_us", "connect after an idle gap, watch off, p50", "µs",
         "lower"),
        ("connect_watch_2s_p50_us", "connect after an idle gap, watch 2 s, p50", "µs",
         "lower"),
        ("connect_watch_5ms_p50_us", "connect after an idle gap, watch 5 ms, p50", "µs",
         "lower"),
        ("connect_watch_5ms_p99_us", "connect after an idle gap, watch 5 ms, p99", "µs",
         "lower"),
    ])
    + _figures("bench_light", [
        ("ocs1_p50_us", "OCS detected - true crossing, p50", "µs", None),
        ("ocs1_p99_abs_us", "OCS |detected - true|, p99", "µs", "lower", Target("<=", 1000)),
        ("ocs1_max_abs_us", "OCS |detected - true|, max", "µs", "lower"),
        ("mesh1_p50_us", "mesh detected - true crossing, p50", "µs", None),
        ("mesh1_p99_abs_us", "mesh |detected - true|, p99", "µs", "lower", Target("<=", 200)),
        ("mesh1_max_abs_us", "mesh |detected - true|, max", "µs", "lower"),
    ])
)


class BadInput(Exception):
    """A file given on the command line that cannot be used: a one-line message, exit 2."""


class BenchmarkFailed(Exception):
    pass


# -- numbers and verdicts -----------------------------------------------------------------


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def fmt(value: float) -> str:
    """A figure as the table shows it: thousands grouped, about three significant digits."""
    if not math.isfinite(value):
        return str(value)
    size = abs(value)
    if isinstance(value, int) or size >= 1000:
        return f"{value:,.0f}"
    if size >= 10:
        return f"{value:.1f}"
    if size >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def signed(value: float) -> str:
    return ("+" if value > 0 else "") + fmt(value)


def target_text(figure: Figure) -> str:
    target = figure.target
    if target is None:
        return DASH
    symbol = SYMBOLS[target.op]
    if target.ref is not None:
        ref = next((f.label for f in FIGURES if f.benchmark == figure.benchmark
                    and f.key == target.ref), target.ref)
        return f"{symbol} {ref}"
    assert target.value is not None
    text = f"{symbol} {target.value:,g}{unit_after(figure)}"
    if target.stretch is not None:
        text += f" (stretch {symbol} {target.stretch:,g})"
    return text


def unit_after(figure: Figure) -> str:
    """The unit after a number in a target or a verdict; a ratio's reads plainer without."""
    return "" if figure.unit == TIMES else f" {figure.unit}"


def verdict(figure: Figure, figures: dict[str, float]) -> tuple[bool | None, str]:
    """(met, the verdict as the table says it); met is None for a figure without a target."""
    target = figure.target
    if target is None:
        return None, "no target"
    value = figures.get(figure.key)
    goal = figures.get(target.ref) if target.ref is not None else target.value
    if value is None or goal is None or not math.isfinite(value):
        return False, "missed (no figure)"
    unit = "" if target.ref is not None else unit_after(figure)
    if not OPS[target.op](value, goal):
        return False, f"missed by {fmt(abs(value - goal))}{unit}"
    if target.stretch is None:
        return True, "met"
    if OPS[target.op](value, target.stretch):
        return True, "met, stretch met"
    return True, f"met, stretch missed by {fmt(abs(value - target.stretch))}{unit}"


def change(figure: Figure, now: float, before: float) -> str:
    """The change from ``before``, absolute and relative, and whether it is better."""
    diff = now - before
    if not diff:
        return "no change"
    text = signed(diff)
    if before:
        text += f" ({diff / abs(before) * 100:+.0f} %)"
    if figure.better is not None:
        text += ", better" if (diff < 0) == (figure.better == "lower") else ", worse"
    return text


def verdicts(results: Results) -> list[dict[str, Any]]:
    """One row per figure of the summary table, for the results file and the table."""
    rows = []
    for figure in FIGURES:
        figures = results["benchmarks"].get(figure.benchmark)
        if figures is None:
            continue  # not run (--only) or failed: its error says so
        met, text = verdict(figure, figures)
        rows.append({"benchmark": figure.benchmark, "figure": figure.key,
                     "label": figure.label, "value": figures.get(figure.key),
                     "unit": figure.unit, "target": target_text(figure), "verdict": text,
                     "met": met, "better": figure.better})
    return rows


def missed(results: Results) -> list[str]:
    return [f"{row['benchmark']}: {row['label']}" for row in results["verdicts"]
            if row["met"] is False]


def targets(results: Results) -> int:
    return sum(row["met"] is not None for row in results["verdicts"])


# -- the machine, the commit --------------------------------------------------------------


def cpu_model() -> str | None:
    try:
        lines = Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return None


def memory_gib() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (AttributeError, ValueError, OSError):
        return None


def event_loop() -> str:
    """The loop the benchmarks run on: labd.runtime picks uvloop where it is installed."""
    if loop_factory() is None:
        return "asyncio"
    return f"uvloop {importlib.metadata.version('uvloop')}"


def machine() -> dict[str, Any]:
    """What the figures depend on, and nothing that names the machine or its paths."""
    return {"os": platform.system(), "arch": platform.machine(),
            "python": platform.python_version(),
            "implementation": platform.python_implementation(),
            "cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
            "memory_gib": memory_gib(), "loop": event_loop()}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def commit() -> str:
    """The short hash of HEAD, "+dirty" when tracked files differ from it."""
    try:
        head = git("rev-parse", "--short", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


# -- running ------------------------------------------------------------------------------


def run_one(bench: Benchmark, sizes: Sequence[str], verbose: bool) -> dict[str, float]:
    """Run one benchmark script in a process of its own; its figures from its --json."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "figures.json"
        command = [sys.executable, str(ROOT / "scripts" / f"{bench.name}.py"), *sizes,
                   "--json", str(out)]
        try:
            # With --verbose the script's own report goes straight to the terminal.
            proc = subprocess.run(command, cwd=ROOT, capture_output=not verbose, text=True,
                                  timeout=BENCH_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired as exc:
            raise BenchmarkFailed(f"still running after {BENCH_TIMEOUT_S} s") from exc
        if proc.returncode != 0:
            tail = (proc.stderr or "").strip().splitlines()[-1:] or ["(no message)"]
            raise BenchmarkFailed(f"exit status {proc.returncode}: {tail[0]}")
        try:
            figures = json.loads(out.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise BenchmarkFailed("wrote no figures") from exc
    return {k: v for k, v in figures.items() if is_number(v)}


def selected(only: str | None) -> list[Benchmark]:
    if not only:
        return list(BENCHMARKS)
    names = {n.strip() if n.strip().startswith("bench_") else f"bench_{n.strip()}"
             for n in only.split(",") if n.strip()}
    unknown = names - {b.name for b in BENCHMARKS}
    if unknown:
        raise BadInput(f"--only: no benchmark {', '.join(sorted(unknown))} (there are "
                       f"{', '.join(b.name for b in BENCHMARKS)})")
    return [b for b in BENCHMARKS if b.name in names]


def run_all(benches: Sequence[Benchmark], quick: bool, verbose: bool,
            console: Console) -> Results:
    results: Results = {"schema": SCHEMA, "commit": commit(),
                        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        "machine": machine(), "quick": quick, "sizes": {}, "seconds": {},
                        "benchmarks": {}, "errors": {}}
    for i, bench in enumerate(benches, 1):
        sizes = bench.quick if quick else bench.sizes
        results["sizes"][bench.name] = " ".join(sizes)
        console.print(f"[{i}/{len(benches)}] {bench.name} {' '.join(sizes)}", highlight=False)
        start = time.monotonic()
        try:
            # A spinner on a terminal; plain lines where the output goes to a file or pipe.
            spinner = console.is_terminal and not verbose
            with console.status(f"running {bench.name}") if spinner else nullcontext():
                results["benchmarks"][bench.name] = run_one(bench, sizes, verbose)
        except BenchmarkFailed as exc:
            results["errors"][bench.name] = str(exc)
            console.print(f"      {bench.name} failed: {exc}", highlight=False, markup=False)
        results["seconds"][bench.name] = round(time.monotonic() - start, 1)
        console.print(f"      {results['seconds'][bench.name]:.1f} s", highlight=False)
    return results


# -- reading a previous results file ------------------------------------------------------


def read_text(path: Path, where: Path, not_text: str) -> str:
    """The file at ``path`` as text, or BadInput naming it as ``where``."""
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"{where}: no such file") from None
    except UnicodeDecodeError:
        raise BadInput(f"{where}: {not_text}") from None
    except OSError as exc:
        raise BadInput(f"{where}: cannot read it ({exc.strerror})") from None


def load_results(path: Path) -> Results:
    """A results file written by this script, or BadInput saying why not, naming it."""
    text = read_text(path, path, "not JSON (not even text)")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadInput(f"{path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    problem = shape_problem(data)
    if problem is not None:
        raise BadInput(f"{path}: not a bench_all results file ({problem})")
    return data  # type: ignore[no-any-return]


def shape_problem(data: object) -> str | None:
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("schema") != SCHEMA:
        return f"schema {data.get('schema')!r}, not {SCHEMA}"
    benchmarks = data.get("benchmarks")
    if not isinstance(benchmarks, dict):
        return 'no "benchmarks" object'
    for name, figures in benchmarks.items():
        if not isinstance(figures, dict) or not all(is_number(v) for v in figures.values()):
            return f'"benchmarks.{name}" is not an object of numbers'
    for key in ("commit", "date"):
        if not isinstance(data.get(key), str):
            return f'no "{key}"'
    if not isinstance(data.get("machine"), dict):
        return 'no "machine" object'
    if not isinstance(data.get("verdicts", []), list):
        return '"verdicts" is not a list'
    return None


# -- the table ----------------------------------------------------------------------------


HEADER = ("benchmark", "figure", "value", "unit", "target", "verdict")


def table_rows(results: Results, before: Results | None = None) -> Iterator[list[str]]:
    """The summary table's rows as text: the columns of HEADER, then "before" and "change"
    when ``before`` is given. The benchmark's name stands on its first row only."""
    last = None
    for row in verdicts(results):
        figure = next(f for f in FIGURES
                      if f.benchmark == row["benchmark"] and f.key == row["figure"])
        value = row["value"]
        cells = [row["benchmark"] if row["benchmark"] != last else "", row["label"],
                 fmt(value) if value is not None else DASH, row["unit"], row["target"],
                 row["verdict"]]
        last = row["benchmark"]
        if before is not None:
            old = before["benchmarks"].get(figure.benchmark, {}).get(figure.key)
            if old is None or value is None:
                cells += [DASH, DASH]
            else:
                cells += [fmt(old), change(figure, value, old)]
        yield cells
    for name, error in results.get("errors", {}).items():
        yield [name, "failed", DASH, "", DASH, error] + ([DASH, DASH] if before else [])


def when(results: Results) -> str:
    """The date and minute measured: the results file holds an ISO 8601 UTC stamp."""
    return f"{results['date'].replace('T', ' ')[:16]} UTC"


def headline(results: Results) -> str:
    m = results["machine"]
    model = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
    sizes = "--quick sizes" if results.get("quick") else "the default sizes"
    return (f"commit {results['commit']}, {when(results)}, at "
            f"{sizes}; {m.get('cpu_count')} CPUs{model}, Python {m.get('python')}, "
            f"{m.get('loop')}")


def print_table(results: Results, before: Results | None, console: Console) -> None:
    # The headline above the table, not its title: a title wraps at the table's width.
    console.print(Text(f"labd benchmarks: {headline(results)}"))
    table = Table()
    for column in HEADER + (("before", "change") if before is not None else ()):
        table.add_column(column, justify="right" if column in ("value", "before") else "left")
    rows = list(table_rows(results, before))
    for i, cells in enumerate(rows):
        last_of_group = i + 1 == len(rows) or rows[i + 1][0] != ""
        # Text, not markup: an error's message may hold brackets.
        table.add_row(*(Text(c) for c in cells), end_section=last_of_group)
    console.print(table)
    if before is not None:
        console.print(f"before: commit {before['commit']}, {when(before)}"
                      + (" (--quick sizes)" if before.get("quick") else ""), highlight=False)
        if before.get("sizes") and before.get("sizes") != results.get("sizes"):
            console.print("note: the two runs' sizes differ; their figures compare loosely",
                          highlight=False)


# -- the docs -----------------------------------------------------------------------------


def markdown(results: Results) -> str:
    """The generated section of docs/benchmarks.md: the date, the commit, the machine and
    the summary table."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    # Blank lines around it: the table ends before the end marker in every Markdown reader.
    lines = ["", f"Measured on {headline(results)}.", "",
             "| " + " | ".join(HEADER) + " |",
             "| --- | --- | ---: | --- | --- | --- |"]
    lines += ["| " + " | ".join(cell(c) for c in cells) + " |" for cells in table_rows(results)]
    return "\n".join(lines) + "\n\n"


def check_markers(text: str, where: Path) -> None:
    begins = [i for i, line in enumerate(text.splitlines()) if line.strip() == BEGIN]
    ends = [i for i, line in enumerate(text.splitlines()) if line.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        raise BadInput(f"{where}: wants one {BEGIN} line followed by one {END} line")


def replace_section(text: str, section: str, where: Path) -> str:
    """``text`` with what lies between the markers replaced by ``section``."""
    check_markers(text, where)
    lines = text.splitlines(keepends=True)
    begin = next(i for i, line in enumerate(lines) if line.strip() == BEGIN)
    end = next(i for i, line in enumerate(lines) if line.strip() == END)
    return "".join(lines[:begin + 1]) + section + "".join(lines[end:])


def read_docs(path: Path, where: Path) -> str:
    """The docs file at ``path`` (``where`` names it in messages), markers checked."""
    text = read_text(path, where, "not text")
    check_markers(text, where)
    return text


# -- the command --------------------------------------------------------------------------


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: a smoke run in seconds, figures not for comparison")
    parser.add_argument("--only", metavar="NAME,...",
                        help="run only these benchmarks (switch, daemon, mesh, heal, light)")
    parser.add_argument("--out", type=Path, default=Path("bench.json"), metavar="FILE",
                        help="write the results here (default: bench.json)")
    parser.add_argument("--against", type=Path, metavar="FILE",
                        help="a previous results file to compare with")
    parser.add_argument("--docs", action="store_true",
                        help="regenerate the summary section of --docs-file")
    parser.add_argument("--docs-file", type=Path, metavar="FILE",
                        help="default: docs/benchmarks.md of this checkout")
    parser.add_argument("--from", dest="source", type=Path, metavar="FILE",
                        help="show (and with --docs, write up) a results file instead of "
                             "running the benchmarks")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if any target is missed")
    parser.add_argument("--verbose", action="store_true",
                        help="show each benchmark's own report as it runs")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    # Named as given, or relative to the checkout: messages name no machine's paths.
    docs_file = args.docs_file or Path("docs/benchmarks.md")
    docs_path = args.docs_file or ROOT / docs_file
    console = Console() if sys.stdout.isatty() else Console(width=200)
    try:
        # Every file given is read before the benchmarks run: a bad one costs no run.
        before = load_results(args.against) if args.against is not None else None
        docs = read_docs(docs_path, docs_file) if args.docs else None
        if args.source is not None:
            results = load_results(args.source)
        else:
            results = run_all(selected(args.only), args.quick, args.verbose, console)
    except BadInput as exc:
        print(f"bench_all: {exc}", file=sys.stderr)
        return 2
    results["verdicts"] = verdicts(results)
    if args.against is not None:
        results["against"] = {"commit": before["commit"] if before else None,
                              "date": before["date"] if before else None}
    print_table(results, before, console)
    if args.source is None:
        args.out.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n",
                            encoding="utf-8")
        console.print(f"results written to {args.out}", highlight=False)
    if docs is not None:
        docs_path.write_text(replace_section(docs, markdown(results), docs_file),
                             encoding="utf-8")
        console.print(f"summary written to {docs_file}", highlight=False)
    misses = missed(results)
    console.print(f"targets met: {targets(results) - len(misses)} of {targets(results)}",
                  highlight=False)
    if results.get("errors"):
        return 1
    return 1 if args.check and misses else 0


if __name__ == "__main__":
    sys.exit(main())
