"""``labd measure runs``, ``show`` and ``compare``: the runs kept, read back."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from labd.commands.common import console, fail
from labd.commands.measure.kept import write_outputs
from labd.commands.measure.options import (
    CheckOption,
    CsvOption,
    DpiOption,
    FormatOption,
    FullOption,
    ParquetOption,
    PlotsOption,
    RunsOption,
    check_outcome,
    outputs,
)
from labd.commands.measure.schedule import schedule_report
from labd.errors import LabdError, RunError

if TYPE_CHECKING:
    from labd.measure.runs import Run, RunStore

#: Parameters too long for a line: the timing model (the table says it), and an
#: availability run's profile and model inputs (its report's last table gives them).
LONG_PARAMS = ("timing", "profile", "model", "modelled")


def measure_runs(runs: RunsOption = "labd-runs.sqlite") -> None:
    """The runs kept, newest first."""
    from labd.measure.runs import RunStore

    store = RunStore(runs)
    table = Table(title=f"runs in {runs}")
    for column in ("name", "kind", "status", "rows", "lab", "started", "parameters"):
        table.add_column(column)
    try:
        for measured, count in store.all():
            table.add_row(measured.name, measured.kind, measured.status,
                          f"{count}/{measured.planned}", measured.lab_name,
                          measured.started.strftime("%Y-%m-%d %H:%M:%S"),
                          ", ".join(f"{k}={v}" for k, v in measured.params.items()
                                    if v is not None and k not in LONG_PARAMS))
    finally:
        store.close()
    console.print(table)


def parameters(params: dict[str, Any]) -> Table:
    """A run's parameters, one a line: nested values as ``key value`` pairs, lists joined,
    what was not set left out."""
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="dim")
    grid.add_column()

    def shown(value: Any) -> str:
        if isinstance(value, dict):
            return ", ".join(f"{k} {shown(v)}" for k, v in value.items() if v is not None)
        if isinstance(value, list | tuple):
            return ", ".join(map(shown, value)) or "none"
        return json.dumps(value) if isinstance(value, str) and not value.strip() else str(value)

    for key, value in params.items():
        if value is not None and value != {}:
            grid.add_row(f"  {key}", shown(value))
    return grid


def measure_show(
    name: Annotated[str, typer.Argument(help="The run.")],
    runs: RunsOption = "labd-runs.sqlite",
    csv_path: CsvOption = None,
    parquet: ParquetOption = None,
    plots: PlotsOption = None,
    plot_format: FormatOption = "png",
    dpi: DpiOption = 150,
    full: FullOption = False,
    check: CheckOption = False,
) -> None:
    """A kept run's summary (and its rows exported, its plots drawn; --check: its truth
    check as the exit status)."""
    from labd.emulation.campaign import failover_report
    from labd.measure.reconfig import model_check, summary_table
    from labd.measure.runs import RunStore

    style = outputs(plots=plots, plot_format=plot_format, dpi=dpi, parquet=parquet)
    store = RunStore(runs)
    try:
        measured = store.get(name)
        rows = store.rows(measured)
        short = {k: v for k, v in measured.params.items() if k not in LONG_PARAMS[1:]}
        console.print(f"run [cyan]{measured.name}[/]: {measured.status}, labd "
                      f"{measured.labd_version}, {measured.target}, lab {measured.lab_name} "
                      f"(sha256 {measured.lab_sha256[:12]})")
        console.print(parameters(short))
        if check and measured.kind != "reconfig":
            raise LabdError(f"--check: run {name} is a {measured.kind} run; only a reconfig "
                            "run has a truth check")
        if measured.kind == "schedule":
            schedule_report(measured, rows)
        elif measured.kind == "failover":
            for table in failover_report(rows, None):
                console.print(table)
        elif measured.kind == "availability":
            from labd.measure.availability_report import availability_report, model_of

            for table in availability_report(measured, rows, model_of(measured.params, rows)):
                console.print(table)
        else:
            console.print(summary_table(measured, rows, full=full))
        timing = measured.params.get("timing")
        if timing and measured.kind == "reconfig":
            console.print(model_check(rows, timing))
        write_outputs(measured, rows, csv_path, parquet, plots, style)
    except LabdError as exc:
        raise fail(str(exc)) from None
    finally:
        store.close()
    if check:
        check_outcome(rows, timing)


def measure_compare(
    first: Annotated[str, typer.Argument(
        help="The run to compare against (A); repeats of its set-up after commas (a1,a2).")],
    second: Annotated[str, typer.Argument(
        help="The run compared (B); repeats of its set-up after commas (b1,b2).")],
    runs: RunsOption = "labd-runs.sqlite",
    full: FullOption = False,
    noise_ms: Annotated[float, typer.Option(
        min=0, help="A difference smaller than this (ms) is noise, whatever its interval.")]
    = 0.5,
) -> None:
    """Two set-ups side by side: every figure's p50 and p99 in both, a 95 % bootstrap
    interval of the difference and a verdict: within noise, or B slower or faster. A
    difference is held against the run-to-run variation: between repeats of a set-up where
    given (a1,a2 b1,b2), else between the halves of each run."""
    from labd.measure.reconfig import compare_schedules, compare_table
    from labd.measure.runs import RunStore

    store = RunStore(runs)
    try:
        side_a, side_b = _side(store, first), _side(store, second)
        a, b = side_a[0], side_b[0]
        kinds = {run.kind for run in (*side_a, *side_b)}
        if len(kinds) > 1:
            raise LabdError("runs of one kind only: " + ", ".join(
                f"{run.name} is a {run.kind} run" for run in (*side_a, *side_b)))
        if a.kind in ("schedule", "availability") and (len(side_a) > 1 or len(side_b) > 1):
            raise LabdError(f"{a.kind} runs are compared one to one (no repeats)")
        if a.kind == "availability":
            from labd.measure.availability_report import compare_availability

            for table in compare_availability(a, store.rows(a), b, store.rows(b),
                                              noise_ms=noise_ms):
                console.print(table)
        elif a.kind == "schedule":
            console.print(compare_schedules(a, store.rows(a), b, store.rows(b),
                                            noise_ms=noise_ms))
        else:
            console.print(compare_table(
                a, store.rows(a), b, store.rows(b), full=full, noise_ms=noise_ms,
                repeats_a=[(run, store.rows(run)) for run in side_a[1:]],
                repeats_b=[(run, store.rows(run)) for run in side_b[1:]]))
    except LabdError as exc:
        raise fail(str(exc)) from None
    finally:
        store.close()


def _side(store: RunStore, names: str) -> list[Run]:
    """The runs a compare argument names: one run, or repeats of one set-up after commas
    (a name that holds a comma itself is taken whole when a run has it)."""
    try:
        return [store.get(names)]
    except RunError:
        if "," not in names:
            raise
    parts = [part.strip() for part in names.split(",")]
    if len(set(parts)) != len(parts) or not all(parts):
        raise LabdError(f"{names!r}: name each run once, after commas")
    return [store.get(part) for part in parts]
