"""``labd measure reconfig`` and ``labd measure compare``: reconfiguration campaigns kept as
named runs (labd.measure.runs), their summaries, exports and comparisons.

A campaign runs against a daemon (``--url``) or a lab file (``--lab``: its emulated
instruments and a daemon on them are started here, and every row gets the emulator's ground
truth beside it: when the command arrived and when the light settled).
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import re
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from instruments.errors import InstrumentError
from labd import __version__
from labd.client.api import DaemonClient
from labd.client.control import Backdoor
from labd.errors import BackdoorError, CampaignError, LabdError
from labd.lab.file import file_sha256, load_lab
from labd.measure.campaign import ReconfigPlan, batch_sizes, free_ports, run_reconfig
from labd.measure.runs import Run, RunStore
from labd.measure.stats import (
    DASH,
    NOISE_MS,
    NOISE_SHARE,
    RESAMPLES,
    SEED,
    compare_shares,
    compare_values,
    enough,
)
from labd.vocabulary import PHASES, SPANS, percentile, span_ms


@dataclass
class Measured:
    """What a run was measured on: the lab's name, its file's SHA-256, and where."""

    lab_name: str
    lab_sha256: str
    where: str


@dataclass
class Target(Measured):
    client: DaemonClient = field(kw_only=True)
    backdoor: Backdoor | None = field(default=None, kw_only=True)
    """The emulators' control endpoint, where the lab is emulated here (ground truth)."""


@contextlib.asynccontextmanager
async def open_target(*, lab: str | None, url: str, token: str | None,
                      control: str | None = None) -> AsyncIterator[Target]:
    """The daemon to measure: one at ``url`` (with ``control``, the control endpoint of the
    emulators it drives, for ground truth), or one started here on ``lab`` in emulation."""
    if lab is None:
        client = DaemonClient(url, token)
        backdoor = Backdoor(control) if control else None
        try:
            health = await client.get("/v1/health")
            yield Target(health["lab"], health.get("lab_sha256", ""), url, client=client,
                         backdoor=backdoor)
        finally:
            await client.close()
            if backdoor is not None:
                await backdoor.close()
        return
    from labd.emulation.rig import emulated_rig

    loaded = load_lab(lab)
    # The emulators in a process of their own (as the hardware would be): the daemon's
    # numbers are then not shared with the devices' own work on one event loop.
    with tempfile.TemporaryDirectory() as scratch:
        async with emulated_rig(loaded, db=str(Path(scratch) / "measure.sqlite"),
                                token="measure", apart=True, hosts=False) as rig:
            client = DaemonClient(rig.daemon.url, "measure")
            try:
                yield Target(loaded.lab.name, file_sha256(loaded.source),
                             f"lab {loaded.source} (emulated)", client=client,
                             backdoor=rig.backdoor)
            finally:
                await client.close()


def slim(row: dict[str, Any]) -> dict[str, Any]:
    """What a run keeps of one reconfiguration."""
    phases = row.get("phases") or {}
    return {"switch": row["switch"], "pattern": row["pattern"], "k": row["k"],
            "round": row["round"], "id": row.get("id"), "outcome": row.get("outcome"),
            "error": row.get("error"), "cause": row.get("cause"),
            "pairs": len(row.get("connected") or []) + len(row.get("disconnected") or []),
            "phases": {p: phases.get(p) for p in PHASES}}


def row_values(row: dict[str, Any]) -> dict[str, float]:
    """The figures of one row, in ms: each span of labd.vocabulary.SPANS, and where the lab was
    emulated, the device's true time and labd's excess over it (of the switching time:
    the emulator times the mirrors from the command that moves them)."""
    values = {name: v for name, a, b in SPANS if (v := span_ms(row, a, b)) is not None}
    if "switching" not in values and "device" in values:  # rows kept before it was recorded
        values["switching"] = values["device"]
    truth = row.get("truth_ms")
    if truth is not None:
        values["truth"] = truth
        if "switching" in values:
            values["switching - truth"] = values["switching"] - truth
    return values


#: The figures of a reconfiguration, in the order reports give them.
FIGURES = ("device", "switching", "light", "software", "total", "truth", "switching - truth")


def _ordered(figure: str) -> int:
    return FIGURES.index(figure) if figure in FIGURES else len(FIGURES)


def figure_values(rows: list[dict[str, Any]], *, full: bool = True
                  ) -> dict[tuple[str, int | None, str], list[float]]:
    """(switch, batch size, figure) → the values of the rows that succeeded, in ms; the
    batch size None where ``full`` is false (every batch size together)."""
    groups: dict[tuple[str, int | None, str], list[float]] = {}
    for row in rows:
        if row.get("outcome") != "ok":
            continue
        for name, value in row_values(row).items():
            key = (row["switch"], int(row["k"]) if full else None, name)
            groups.setdefault(key, []).append(value)
    return {key: groups[key] for key in sorted(
        groups, key=lambda g: (g[0], g[1] or 0, _ordered(g[2]), g[2]))}


def stats_of(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": max(values)}


def summarise(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, float]]:
    """(switch, batch size, figure) → n, p50, p90, p99, max over the rows that succeeded."""
    return {(s, k or 0, f): stats_of(v) for (s, k, f), v in figure_values(rows).items()}


async def attach_truth(backdoor: Backdoor, row: dict[str, Any], seen: dict[str, int]) -> None:
    """The emulator's record of the change this row made: from the command's arrival to
    the last mirror settling (``truth_ms``)."""
    switch = row["switch"]
    changes = (await backdoor.truth(switch, seen.get(switch, 0)))["changes"]
    if changes:
        seen[switch] = changes[-1]["seq"]
    phases = row["phases"]
    start, end = phases.get("dispatched"), phases.get("acknowledged")
    if start is None or end is None:
        return
    mine = [c for c in changes if start <= c["arrived_ns"] <= end and c["op"] != "port"]
    if mine:
        row["truth_ms"] = (max(c["settled_ns"] for c in mine)
                           - min(c["arrived_ns"] for c in mine)) / 1e6


async def switches_of(client: DaemonClient) -> list[str]:
    instruments = await client.get("/v1/instruments")
    return [i["id"] for i in instruments if i.get("kind", "switch") == "switch"]


async def switch_models(client: DaemonClient, switches: list[str]) -> dict[str, str]:
    """Each switch's make and model as it identified itself (its driver where it has not),
    kept with a run so that its reports and plots say what was measured."""
    models = {}
    for entry in await client.get("/v1/instruments"):
        if entry["id"] in switches:
            identity = entry.get("identity") or {}
            made = " ".join(p for p in (identity.get("vendor"), identity.get("model")) if p)
            models[entry["id"]] = made or entry.get("driver") or "switch"
    return models


def emulated(run: Run) -> bool:
    """Whether the run was measured on emulators (runs kept before this was recorded: a
    lab file's run always was)."""
    said = run.params.get("emulated")
    return bool(said) if said is not None else run.target.endswith("(emulated)")


def conditions(run: Run) -> str:
    """What a run was measured on, for titles: the lab and whether it was emulated."""
    return f"lab {run.lab_name}, {'emulated' if emulated(run) else 'real'}"


def switch_label(run: Run, switch: str, sep: str = ", ") -> str:
    """A switch as titles name it: its id, make and model, and the timing model it was set
    to (emulated); ``sep`` between the model and the timing."""
    model = (run.params.get("switch_models") or {}).get(switch)
    timing = run.params.get("timing") or {}
    label = f"{switch}: {model}" if model else switch
    if switch in timing.get("switches", []):
        label += f"{sep}{timing['switch_time_ms']:g} ± {timing['jitter_ms']:g} ms model"
    return label


def progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), console=console, transient=True)


async def keep(store: RunStore, run: Run, rows: list[dict[str, Any]],
               source: AsyncIterator[dict[str, Any]], progress: Progress, task: Any,
               then: Callable[[dict[str, Any]], Any] | None = None) -> None:
    """Measure from ``source``, committing each row to the run as it comes (after
    ``then(row)`` adds what it adds)."""
    async with aclosing(source) as measuring:  # type: ignore[type-var]
        async for row in measuring:
            if then is not None:
                await then(row)
            await asyncio.to_thread(store.add, run, row)
            rows.append(row)
            progress.advance(task)


async def run_campaign(target: Target, plans: list[ReconfigPlan], store: RunStore, run: Run,
                       console: Console, done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measure what ``plans`` ask for beyond the rows already ``done`` (a resumed run),
    keeping each row in the run as it comes."""
    rows = list(done)
    per_switch = Counter(r["switch"] for r in rows)
    seen: dict[str, int] = {}
    backdoor = target.backdoor
    truth_of = None if backdoor is None else partial(attach_truth, backdoor, seen=seen)
    with progress_bar(console) as progress:
        task = progress.add_task(f"run {run.name}", total=run.planned, completed=len(rows))
        for plan in plans:
            if target.backdoor is not None:  # only the changes from here on
                truth = await target.backdoor.truth(plan.switch)
                seen[plan.switch] = truth["changes"][-1]["seq"] if truth["changes"] else 0
            progress.update(task, description=f"{plan.switch} {plan.pattern}")

            async def slimmed(plan: ReconfigPlan = plan) -> AsyncIterator[dict[str, Any]]:
                async with aclosing(run_reconfig(target.client, plan,
                                                 skip=per_switch[plan.switch])) as answers:
                    async for answer in answers:
                        yield slim(answer)

            await keep(store, run, rows, slimmed(), progress, task, truth_of)
    return rows


async def plan_campaign(target: Target, switches: list[str] | None, pattern: str,
                        rounds: int, k: int, verify_light: bool, seed: int
                        ) -> tuple[list[ReconfigPlan], int]:
    """One plan per switch (each checked against the switch's free ports before anything
    is sent) and how many rows they will measure."""
    names = switches or await switches_of(target.client)
    plans, planned = [], 0
    for i, switch in enumerate(names):
        plan = ReconfigPlan(switch, pattern, rounds, k, verify_light, seed + i)
        plan.check()
        planned += rounds * len(batch_sizes(plan, await free_ports(target.client, switch)))
        plans.append(plan)
    return plans, planned


# -- reports -------------------------------------------------------------------------------
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


def compare_table(a: Run, rows_a: list[dict[str, Any]], b: Run, rows_b: list[dict[str, Any]],
                  *, full: bool = False, noise_ms: float = NOISE_MS) -> Table:
    """Two runs side by side: each figure's p50 and p99 in both, and a verdict on the
    difference from bootstrap intervals (labd.measure.stats) — per switch and figure, or
    with ``full`` per batch size too."""
    failover = a.kind == "failover"
    if failover:
        first, second = failover_values(rows_a), failover_values(rows_b)
    else:
        first, second = figure_values(rows_a, full=full), figure_values(rows_b, full=full)
    table = Table(title=f"{a.name} ({conditions(a)}) → {b.name} ({conditions(b)}); ms",
                  caption=f"95 % bootstrap intervals of {b.name} - {a.name} ({RESAMPLES:,} "
                          f"resamples, seed {SEED}); a difference under {noise_ms:g} ms is "
                          "noise whatever its interval")
    by_k = full and not failover
    columns = ["drill" if failover else "switch", *(["k"] if by_k else []),
               "stage" if failover else "figure", "n", a.name, b.name, "verdict"]
    for column in columns:
        table.add_column(column, justify="right" if column in ("k", "n", a.name, b.name)
                         else "left")
    # One command moves the light in both: the switching time is the device time again.
    same = set() if failover else _switching_is_device(rows_a) & _switching_is_device(rows_b)
    for key in sorted(set(first) | set(second), key=lambda g: (
            g[0], g[1] or 0, _ordered(g[2]), g[2])):
        if key[2] == "switching" and key[0] in same and not full:
            continue
        x, y = first.get(key, []), second.get(key, [])
        for q in (50, 99):
            said = compare_values(x, y, q, names=(a.name, b.name), noise_ms=noise_ms)
            table.add_row(key[0], *([str(key[1])] if by_k else []), f"{key[2]} p{q}",
                          f"{len(x)} / {len(y)}",
                          *(DASH if v is None else f"{v:.3f}" for v in (said.a, said.b)),
                          said.verdict)
    return table


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
                          f"resamples, seed {SEED}); a difference under {noise_ms:g} ms, or "
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
                said = compare_values(xs, ys, q, names=(a.name, b.name), noise_ms=noise_ms)
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


def default_name(kind: str) -> str:
    return f"{kind}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def params_of(plans: list[ReconfigPlan]) -> dict[str, Any]:
    first = plans[0]
    return {"switches": [p.switch for p in plans], "pattern": first.pattern,
            "rounds": first.rounds, "k": first.k, "verify_light": first.verify_light,
            "seed": first.seed}


def plans_from(params: dict[str, Any]) -> list[ReconfigPlan]:
    """The plans of a stored run (a resumed run measures exactly what it was asked to)."""
    return [ReconfigPlan(s, params["pattern"], params["rounds"], params["k"],
                         params["verify_light"], params["seed"] + i)
            for i, s in enumerate(params["switches"])]


def new_run(store: RunStore, *, name: str | None, kind: str, params: dict[str, Any],
            target: Measured, planned: int) -> Run:
    return store.create(name=name or default_name(kind), kind=kind, params=params,
                        labd_version=__version__, target=target.where,
                        lab_name=target.lab_name, lab_sha256=target.lab_sha256,
                        planned=planned)


def resume_run(store: RunStore, name: str, kind: str, target: Measured, console: Console
               ) -> tuple[Run, list[dict[str, Any]]]:
    """An interrupted run to go on with, and the rows it holds."""
    measured = store.get(name)
    if measured.kind != kind:
        raise LabdError(f"run {name!r} is a {measured.kind} run, not a {kind} run")
    if measured.status == "complete":
        raise LabdError(f"run {name!r} is complete; nothing to resume")
    if measured.lab_sha256 and measured.lab_sha256 != target.lab_sha256:
        console.print(f"[yellow]the lab file differs from the one run {name} began on[/]")
    store.reopen(measured)
    return measured, store.rows(measured)


@contextlib.asynccontextmanager
async def finishing(store: RunStore, run: Run) -> AsyncIterator[None]:
    """The run's status after the work inside: complete, interrupted (Ctrl-C; what was
    measured is kept) or failed (with why)."""
    try:
        yield
    except asyncio.CancelledError:
        store.finish(run, "interrupted")
        raise
    except (LabdError, InstrumentError) as exc:
        store.finish(run, "failed", str(exc))
        raise
    store.finish(run, "complete")


async def apply_timing(target: Target, switches: list[str], timing: dict[str, Any] | None,
                       console: Console, *, light: bool = False) -> None:
    """Set the emulated switches' timing model (lab mode); ``timing["switches"]`` says
    which took it (a mesh's time is its heaters' settling, not a setting). With ``light``
    (verification on), a model slower than a switch's light window is refused first."""
    if timing is None or target.backdoor is None:
        return
    model = {k: v for k, v in timing.items() if k != "switches"}
    if light:
        slowest = model["switch_time_ms"] + model["jitter_ms"]
        for switch in switches:
            if (await target.backdoor.describe(switch)).get("timing") is None:
                continue  # it will not take the model
            state = await target.client.get(f"/v1/switches/{switch}")
            window = state["light_window_ms"]
            if state["metered_paths"] and slowest >= window:
                raise CampaignError(
                    f"--switch-ms {model['switch_time_ms']:g} (± {model['jitter_ms']:g}): "
                    f"{switch}'s light window is {window:g} ms, so every light verification "
                    "would time out; raise 'light_window_ms' in the lab file, or measure "
                    "with --no-light")
    timing["switches"] = []
    for switch in switches:
        try:
            await target.backdoor.set_timing(switch, **model)
            timing["switches"].append(switch)
        except BackdoorError as exc:
            console.print(f"  {switch}: measured as it is ({exc})")
