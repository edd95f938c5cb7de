"""A kept run's reports: its summary table with failures counted by reason, the timing
model check, two runs compared (reconfiguration, failover and schedule runs), and its
CSV and Parquet exports.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from labd.errors import LabdError
from labd.measure.figures import (
    conditions,
    figure_order,
    figure_values,
    row_values,
    stats_of,
)
from labd.measure.runs import Run
from labd.measure.stats import (
    DASH,
    NOISE_MS,
    NOISE_SHARE,
    RESAMPLES,
    SEED,
    between_runs,
    compare_shares,
    compare_values,
    enough,
    run_to_run,
    within_run,
)
from labd.vocabulary import PHASES, percentile


def reason(row: dict[str, Any]) -> str:
    """A failed row's reason, short enough to count rows by: its outcome, or for a change
    the device or its link refused, the error without the switch's name, the command
    quoted, what was done afterwards or the ports and channels it named (a report's
    grouping only: nothing decides by it)."""
    outcome = str(row.get("outcome") or "no outcome")
    if outcome != "failed":
        return outcome.replace("-", " ")
    text = str(row.get("error") or "failed")
    text = text.removeprefix(f"{row['switch']}: ").split("; ")[0]
    text = re.sub(r" \(to '[^']*'\)| \(to \"[^\"]*\"\)", "", text)
    text = re.sub(r"\b(ports?|channels?|pairs?)[\s\d,()@:-]+", r"\1 ", text).strip()
    return text if len(text) <= 60 else text[:59] + "…"


def failures(rows: list[dict[str, Any]]) -> str:
    """``105 reconfigurations (7 failed: 5 port failed, 2 light missing)``."""
    reasons = Counter(reason(r) for r in rows if r.get("outcome") != "ok")
    said = f"{len(rows)} reconfiguration{'s' if len(rows) != 1 else ''}"
    if not reasons:
        return f"{said} (none failed)"
    counted = ", ".join(f"{n} {why}" for why, n in reasons.most_common())
    return f"{said} ({reasons.total()} failed: {counted})"


def _percentile_cell(values: dict[str, float], q: int) -> str:
    """A percentile, marked where it rests on fewer values than it needs (near the max)."""
    return f"{values[f'p{q}']:.3f}{'' if enough(int(values['n']), q) else ' *'}"


def summary_table(run: Run, rows: list[dict[str, Any]], *, full: bool = False) -> Table:
    """The run's figures: per switch and figure over every batch size (``full``: per batch
    size too), with the failures counted by reason."""
    groups = figure_values(rows, full=full)
    same = _switching_is_device(rows)
    table = Table(title=f"run {run.name}: {failures(rows)}; {conditions(run)}; ms",
                  caption="* from fewer values than the percentile needs (10 for a p90, "
                          "100 for a p99): near the max, not the percentile"
                  if any(not enough(len(v), 99) for v in groups.values()) else None)
    for column in ("switch", "k", "figure", "n", "p50", "p90", "p99", "max"):
        table.add_column(column, justify="left" if column in ("switch", "figure") else "right")
    ks: dict[str, set[int]] = {}
    for row in rows:
        if row.get("outcome") == "ok":
            ks.setdefault(row["switch"], set()).add(int(row["k"]))
    for (switch, k, name), values in groups.items():
        if not full and name == "switching" and switch in same:
            continue  # one command moves the light: the same as the device time
        sizes = sorted(ks.get(switch, {0}))
        batch = str(k) if k is not None else (
            str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}{DASH}{sizes[-1]}")
        s = stats_of(values)
        table.add_row(switch, batch, name, str(s["n"]), f"{s['p50']:.3f}",
                      _percentile_cell(s, 90), _percentile_cell(s, 99), f"{s['max']:.3f}")
    return table


def _switching_is_device(rows: list[dict[str, Any]]) -> set[str]:
    """The switches whose every change was one command (switching and device the same)."""
    differ = {r["switch"] for r in rows
              if (r.get("phases") or {}).get("activated") != (r.get("phases") or {}).get(
                  "dispatched")}
    return {r["switch"] for r in rows} - differ


@dataclass(frozen=True)
class ModelCheck:
    """One switch held to its timing model: labd's switching time against the emulator's
    truth (percentiles in ms; None where there was nothing to compare)."""

    switch: str
    n: int
    switching: tuple[float, float] | None
    truth: tuple[float, float] | None
    excess: tuple[float, float] | None
    apart: float | None

    @property
    def passed(self) -> bool:
        return (self.apart is not None and self.excess is not None
                and self.apart <= TRUTH_LIMIT_MS and self.excess[1] <= TRUTH_LIMIT_MS)

    def problem(self) -> str | None:
        """Why the check failed, in words; None where it passed."""
        if self.apart is None or self.excess is None:
            return f"{self.switch}: no change with the emulator's truth beside it to check"
        said = []
        if self.apart > TRUTH_LIMIT_MS:
            said.append(f"p99 apart {self.apart:.3f} ms")
        if self.excess[1] > TRUTH_LIMIT_MS:
            said.append(f"excess p99 {self.excess[1]:.3f} ms")
        if not said:
            return None
        return f"{self.switch}: {' and '.join(said)} (limit {TRUTH_LIMIT_MS:g} ms)"


#: How far labd's figures may be from the truth (ms at p99): the model check's target.
TRUTH_LIMIT_MS = 1.0


def check_model(rows: list[dict[str, Any]], timing: dict[str, Any]) -> list[ModelCheck]:
    """Per switch set to the model (``timing["switches"]``): labd's switching time and the
    truth at p50 and p99, how far apart their p99s are, and labd's excess over the truth
    change by change at p50 and p99."""
    by_switch: dict[str, list[dict[str, float]]] = {s: [] for s in timing.get("switches", [])}
    for row in rows:
        if row.get("outcome") == "ok" and row["switch"] in by_switch:
            by_switch[row["switch"]].append(row_values(row))
    checks = []
    for switch, values in sorted(by_switch.items()):
        switching = [v["switching"] for v in values if "switching" in v]
        truth = [v["truth"] for v in values if "truth" in v]
        excess = [v["switching - truth"] for v in values if "switching - truth" in v]
        if not switching or not excess:
            checks.append(ModelCheck(switch, len(switching), None, None, None, None))
            continue

        def pair(v: list[float]) -> tuple[float, float]:
            return percentile(v, 50), percentile(v, 99)

        checks.append(ModelCheck(switch, len(switching), pair(switching), pair(truth),
                                 pair(excess),
                                 abs(percentile(switching, 99) - percentile(truth, 99))))
    return checks


def model_check(rows: list[dict[str, Any]], timing: dict[str, Any]) -> Table:
    """Does labd report what the emulated devices did? Per switch set to the model
    (``timing``: switch_time_ms, jitter_ms, and the switches that took it): labd's switching
    time (the command that moves the light → acknowledged), the emulator's own record of
    each change (that command arrived → mirrors settled), and how far apart they are: labd's
    p99 against the truth's (the figure reported against the model's), and labd's excess
    over the truth change by change (stricter: one late reply counts). The target is 1 ms
    at p99."""
    switch_ms, jitter_ms = timing["switch_time_ms"], timing["jitter_ms"]
    table = Table(title=f"Timing model {switch_ms:g} ± {jitter_ms:g} ms: labd's switching "
                        "time against the emulator's truth, ms")
    for column in ("switch", "n", "switching p50", "switching p99", "truth p50", "truth p99",
                   "p99 apart", "excess p50", "excess p99", "≤ 1 ms: p99, excess"):
        table.add_column(column, justify="left" if column == "switch" else "right")
    for check in check_model(rows, timing):
        if check.switching is None or check.truth is None or check.excess is None \
                or check.apart is None:
            table.add_row(check.switch, str(check.n), *[DASH] * 7, "no truth to check")
            continue
        verdicts = ", ".join("yes" if v <= TRUTH_LIMIT_MS else "NO"
                             for v in (check.apart, check.excess[1]))
        table.add_row(check.switch, str(check.n), *(f"{v:.3f}" for v in (
            *check.switching, *check.truth, check.apart, *check.excess)), verdicts)
    return table


#: A kept run and its rows, as compare_table takes each side's runs.
Kept = tuple[Run, list[dict[str, Any]]]


def compare_table(a: Run, rows_a: list[dict[str, Any]], b: Run, rows_b: list[dict[str, Any]],
                  *, full: bool = False, noise_ms: float = NOISE_MS,
                  repeats_a: list[Kept] | None = None, repeats_b: list[Kept] | None = None
                  ) -> Table:
    """Two runs side by side: each figure's p50 and p99 in both, the difference with its
    bootstrap interval, and a verdict (labd.measure.stats) — per switch and figure, or with
    ``full`` per batch size too. ``repeats_a``/``repeats_b`` are further runs of each
    set-up: pooled with it, and their spread is the run-to-run variation a difference is
    held against (without them, the halves of each run stand in)."""
    failover = a.kind == "failover"
    side_a, side_b = [(a, rows_a), *(repeats_a or [])], [(b, rows_b), *(repeats_b or [])]

    def values(rows: list[dict[str, Any]]) -> dict[tuple[str, int | None, str], list[float]]:
        return failover_values(rows) if failover else figure_values(rows, full=full)

    runs_a, runs_b = [values(rows) for _, rows in side_a], [values(rows) for _, rows in side_b]
    # The halves of a run are compared batch size by batch size: a sweep measures its sizes
    # one after another, and k = 1 against k = 16 is the batch's effect, not noise.
    sized = [failover_values(rows) if failover else figure_values(rows, full=True)
             for _, rows in (*side_a, *side_b)]
    first, second = _pooled(runs_a), _pooled(runs_b)
    name_a, name_b = _side_name(side_a), _side_name(side_b)
    repeated = len(side_a) > 1 or len(side_b) > 1
    table = Table(title=f"{name_a} ({conditions(a)}) → {name_b} ({conditions(b)}); ms",
                  caption=f"{name_b} - {name_a}: 95 % bootstrap interval; within noise "
                          f"under {noise_ms:g} ms or the run-to-run variation ("
                          + ("between repeats" if repeated else "between each run's halves: "
                             "repeat each set-up for a better one") + ")")
    by_k = full and not failover
    columns = ["drill" if failover else "switch", *(["k"] if by_k else []),
               "stage" if failover else "figure", "n", name_a, name_b, "Δ 95 % CI",
               "verdict"]
    for column in columns:
        table.add_column(column, justify="left" if column in (
            "drill", "switch", "stage", "figure", "verdict") else "right")
    # One command moves the light in both: the switching time is the device time again.
    same = set() if failover else (_switching_is_device(rows_a)
                                   & _switching_is_device(rows_b))
    for key in sorted(set(first) | set(second), key=lambda g: (
            g[0], g[1] or 0, figure_order(g[2]), g[2])):
        if key[2] == "switching" and key[0] in same and not full:
            continue
        x, y = first.get(key, []), second.get(key, [])
        for q in (50, 99):
            spreads = [between_runs([run.get(key, []) for run in side], q)
                       for side in (runs_a, runs_b)]
            spreads += [within_run(group, q) for run in sized
                        for (switch, k, figure), group in run.items()
                        if (switch, figure) == (key[0], key[2]) and (not full or k == key[1])]
            said = compare_values(x, y, q, names=(name_a, name_b), noise_ms=noise_ms,
                                  spread=max((s for s in spreads if s is not None),
                                             default=None))
            table.add_row(key[0], *([str(key[1])] if by_k else []), f"{key[2]} p{q}",
                          f"{len(x)}/{len(y)}",
                          *(DASH if v is None else f"{v:.2f}" for v in (said.a, said.b)),
                          said.interval, said.word)
    return table


def _pooled(runs: list[dict[tuple[str, int | None, str], list[float]]]
            ) -> dict[tuple[str, int | None, str], list[float]]:
    pooled: dict[tuple[str, int | None, str], list[float]] = {}
    for run in runs:
        for key, values in run.items():
            pooled.setdefault(key, []).extend(values)
    return pooled


def _side_name(side: list[Kept]) -> str:
    return side[0][0].name + (f" +{len(side) - 1}" if len(side) > 1 else "")


def failover_values(rows: list[dict[str, Any]]
                    ) -> dict[tuple[str, int | None, str], list[float]]:
    """(drill kind, None, stage) → ms after the failure, stages in order."""
    groups: dict[tuple[str, int | None, str], list[float]] = {}
    for row in rows:
        for stage, value in row["ms"].items():
            groups.setdefault((row["kind"], None, stage), []).append(value)
    return groups


def failover_summary(rows: list[dict[str, Any]]
                     ) -> dict[tuple[str, int, str], dict[str, float]]:
    """(drill kind, 0, stage) → n, p50, p90, p99, max in ms after the failure."""
    return {(kind, 0, stage): stats_of(v)
            for (kind, _, stage), v in sorted(failover_values(rows).items())}


#: A schedule replay's figures compared as compare_table compares a run's: (figure, its
#: label), each over the windows that needed a change, except the time added per iteration.
SCHEDULE_FIGURES = (("reconfig_ms", "reconfiguration"), ("overrun_ms", "overrun"),
                    ("added", "added per iteration"))


def schedule_values(rows: list[dict[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Per mode: each figure's values (ms), and ``hidden`` (1 or 0 per window that needed
    a change)."""
    out: dict[str, dict[str, list[float]]] = {}
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        needing = [r for r in mine if r["changed"]]
        added: dict[int, float] = {}
        for r in mine:
            added[r["iteration"]] = added.get(r["iteration"], 0.0) + r["overrun_ms"]
        out[mode] = {"reconfig_ms": [r["reconfig_ms"] for r in needing],
                     "overrun_ms": [r["overrun_ms"] for r in needing],
                     "added": list(added.values()),
                     "hidden": [1.0 if r["hidden"] else 0.0 for r in needing]}
    return out


def compare_schedules(a: Run, rows_a: list[dict[str, Any]], b: Run,
                      rows_b: list[dict[str, Any]], *, noise_ms: float = NOISE_MS) -> Table:
    """Two schedule replays side by side, mode by mode: the share of changes hidden, and
    the p50 and p99 of the reconfigurations, their overruns and the time added per
    iteration, each with a verdict from bootstrap intervals as compare_table gives."""
    table = Table(title=f"{a.name} ({conditions(a)}) → {b.name} ({conditions(b)}); ms",
                  caption=f"95 % bootstrap intervals of {b.name} - {a.name} ({RESAMPLES:,} "
                          f"resamples, seed {SEED}); a difference under {noise_ms:g} ms or "
                          "the run-to-run variation (between each run's halves), or under "
                          f"{NOISE_SHARE * 100:g} points of the share hidden, is noise "
                          "whatever its interval")
    for column in ("mode", "figure", "n", a.name, b.name, "verdict"):
        table.add_column(column, justify="right" if column in ("n", a.name, b.name)
                         else "left")
    first, second = schedule_values(rows_a), schedule_values(rows_b)
    for mode in sorted(set(first) | set(second)):
        x, y = first.get(mode, {}), second.get(mode, {})
        hidden_a, hidden_b = x.get("hidden", []), y.get("hidden", [])
        share = compare_shares([v > 0 for v in hidden_a], [v > 0 for v in hidden_b],
                               what="hidden", names=(a.name, b.name))
        table.add_row(mode, "hidden share", f"{len(hidden_a)} / {len(hidden_b)}",
                      *(DASH if v is None else f"{v * 100:.1f} %" for v in (share.a, share.b)),
                      share.verdict)
        for key, label in SCHEDULE_FIGURES:
            xs, ys = x.get(key, []), y.get(key, [])
            for q in (50, 99):
                spreads = [run_to_run([values], q) for values in (xs, ys)]
                said = compare_values(xs, ys, q, names=(a.name, b.name), noise_ms=noise_ms,
                                      spread=max((s for s in spreads if s is not None),
                                                 default=None))
                table.add_row(mode, f"{label} p{q}", f"{len(xs)} / {len(ys)}",
                              *(DASH if v is None else f"{v:.3f}" for v in (said.a, said.b)),
                              said.verdict)
    return table


def flat(run: Run, row: dict[str, Any]) -> dict[str, Any]:
    """One row for a CSV or Parquet file: phases in ns, figures in ms."""
    values = row_values(row)
    return {"run": run.name, "switch": row["switch"], "pattern": row["pattern"],
            "k": row["k"], "round": row["round"], "id": row.get("id"),
            "outcome": row.get("outcome"), "cause": row.get("cause"), "pairs": row.get("pairs"),
            **{f"{p}_ns": row["phases"].get(p) for p in PHASES},
            **{f"{name.replace(' - ', '_minus_')}_ms": values.get(name)
               for name in ("device", "switching", "light", "software", "total", "truth",
                            "switching - truth")},
            "error": row.get("error")}


def export(run: Run, rows: list[dict[str, Any]], *, csv_path: Path | None,
           parquet_path: Path | None) -> list[str]:
    """Write the raw rows (one flat row each: reconfigurations with phases in ns and
    figures in ms; schedule windows as they are); returns what was written."""
    def plain(row: dict[str, Any]) -> dict[str, Any]:
        if run.kind == "reconfig":
            return flat(run, row)
        out: dict[str, Any] = {"run": run.name}
        for key, value in row.items():
            if isinstance(value, dict):  # a drill's stages: one column each
                out.update({f"{stage}_ms": v for stage, v in value.items()})
            else:
                out[key] = ",".join(value) if isinstance(value, list) else value
        return out

    table = [plain(r) for r in rows]
    written = []
    if csv_path is not None:
        with csv_path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.DictWriter(out, fieldnames=list(table[0]) if table else ["run"])
            writer.writeheader()
            writer.writerows(table)
        written.append(str(csv_path))
    if parquet_path is not None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            raise LabdError("--parquet needs pyarrow: pip install 'labd[measure]'") from None
        pq.write_table(pa.Table.from_pylist(table), parquet_path)
        written.append(str(parquet_path))
    return written
