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
import math
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


def summarise(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, float]]:
    """(switch, batch size, figure) → n, p50, p90, p99, max over the rows that succeeded."""
    groups: dict[tuple[str, int, str], list[float]] = {}
    for row in rows:
        if row.get("outcome") != "ok":
            continue
        for name, value in row_values(row).items():
            groups.setdefault((row["switch"], int(row["k"]), name), []).append(value)
    return {key: {"n": len(v), "p50": percentile(v, 50), "p90": percentile(v, 90),
                  "p99": percentile(v, 99), "max": max(v)} for key, v in sorted(groups.items())}


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
def summary_table(run: Run, rows: list[dict[str, Any]]) -> Table:
    failed = sum(1 for r in rows if r.get("outcome") != "ok")
    table = Table(title=f"run {run.name}: {len(rows)} reconfigurations ({failed} failed) on "
                        f"{run.lab_name}; ms")
    for column in ("switch", "k", "figure", "n", "p50", "p90", "p99", "max"):
        table.add_column(column, justify="left" if column in ("switch", "figure") else "right")
    for (switch, k, name), s in summarise(rows).items():
        table.add_row(switch, str(k), name, str(s["n"]), *(f"{s[q]:.3f}" for q in
                                                           ("p50", "p90", "p99", "max")))
    return table


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
    by_switch: dict[str, list[dict[str, float]]] = {}
    for row in rows:
        if row.get("outcome") == "ok" and row["switch"] in timing.get("switches", []):
            by_switch.setdefault(row["switch"], []).append(row_values(row))
    for switch, values in sorted(by_switch.items()):
        switching = [v["switching"] for v in values if "switching" in v]
        truth = [v["truth"] for v in values if "truth" in v]
        excess = [v["switching - truth"] for v in values if "switching - truth" in v]
        if not switching or not excess:
            continue
        apart = abs(percentile(switching, 99) - percentile(truth, 99))
        verdicts = ", ".join("yes" if v <= 1.0 else "NO" for v in (apart, percentile(excess, 99)))
        table.add_row(switch, str(len(switching)), *(f"{percentile(v, q):.3f}" for v, q in (
            (switching, 50), (switching, 99), (truth, 50), (truth, 99))), f"{apart:.3f}",
            f"{percentile(excess, 50):.3f}", f"{percentile(excess, 99):.3f}", verdicts)
    return table


def compare_table(a: Run, rows_a: list[dict[str, Any]], b: Run,
                  rows_b: list[dict[str, Any]]) -> Table:
    """Two runs side by side: each figure's p50 and p99 in both, and the change."""
    table = Table(title=f"{a.name} → {b.name} (ms; change = second - first)")
    for column in ("switch", "k", "figure", "p50 " + a.name, "p50 " + b.name, "Δ p50",
                   "p99 " + a.name, "p99 " + b.name, "Δ p99"):
        table.add_column(column, justify="left" if column in ("switch", "figure") else "right")
    summary = failover_summary if a.kind == "failover" else summarise
    first, second = summary(rows_a), summary(rows_b)
    for key in sorted(set(first) | set(second)):
        x, y = first.get(key), second.get(key)
        cells = []
        for q in ("p50", "p99"):
            before = x[q] if x else math.nan
            after = y[q] if y else math.nan
            change = after - before
            pct = f" ({change / before * 100:+.0f}%)" if before and not math.isnan(change) else ""
            cells += [f"{before:.3f}", f"{after:.3f}", f"{change:+.3f}{pct}"]
        table.add_row(key[0], str(key[1]), key[2], *cells)
    return table


def failover_summary(rows: list[dict[str, Any]]
                     ) -> dict[tuple[str, int, str], dict[str, float]]:
    """(drill kind, 0, stage) → n, p50, p90, p99, max in ms after the failure."""
    groups: dict[tuple[str, int, str], list[float]] = {}
    for row in rows:
        for stage, value in row["ms"].items():
            groups.setdefault((row["kind"], 0, stage), []).append(value)
    return {key: {"n": len(v), "p50": percentile(v, 50), "p90": percentile(v, 90),
                  "p99": percentile(v, 99), "max": max(v)} for key, v in sorted(groups.items())}


def compare_schedules(a: Run, rows_a: list[dict[str, Any]], b: Run,
                      rows_b: list[dict[str, Any]]) -> Table:
    """Two schedule replays side by side, mode by mode."""
    from labd.measure.schedule import schedule_summary

    table = Table(title=f"{a.name} → {b.name} (ms; change = second - first)")
    figures = (("hidden", "hidden share"), ("overrun_p50", "overrun p50"),
               ("overrun_p99", "overrun p99"), ("added_per_iteration", "added per iteration"))
    for column in ("mode", "figure", a.name, b.name, "change"):
        table.add_column(column, justify="left" if column in ("mode", "figure") else "right")
    first = {s["mode"]: s for s in schedule_summary(rows_a)}
    second = {s["mode"]: s for s in schedule_summary(rows_b)}
    for mode in sorted(set(first) | set(second)):
        for key, label in figures:
            x = first.get(mode, {}).get(key, math.nan)
            y = second.get(mode, {}).get(key, math.nan)
            table.add_row(mode, label, f"{x:.3f}", f"{y:.3f}", f"{y - x:+.3f}")
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
