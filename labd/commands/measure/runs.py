"""``labd measure runs``, ``show`` and ``compare``: the runs kept, read back."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.table import Table

from labd.commands.common import console, fail
from labd.commands.measure.kept import write_outputs
from labd.commands.measure.options import CsvOption, ParquetOption, PlotsOption, RunsOption
from labd.commands.measure.schedule import schedule_report
from labd.errors import LabdError


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
                                    if v is not None and k != "timing"))
    finally:
        store.close()
    console.print(table)


def measure_show(
    name: Annotated[str, typer.Argument(help="The run.")],
    runs: RunsOption = "labd-runs.sqlite",
    csv_path: CsvOption = None,
    parquet: ParquetOption = None,
    plots: PlotsOption = None,
) -> None:
    """A kept run's summary (and its rows exported, its plots drawn)."""
    from labd.emulation.failover import failover_report
    from labd.measure.reconfig import model_check, summary_table
    from labd.measure.runs import RunStore

    store = RunStore(runs)
    try:
        measured = store.get(name)
        rows = store.rows(measured)
        console.print(f"run [cyan]{measured.name}[/]: {measured.status}, labd "
                      f"{measured.labd_version}, {measured.target}, lab {measured.lab_name} "
                      f"(sha256 {measured.lab_sha256[:12]}), {json.dumps(measured.params)}")
        if measured.kind == "schedule":
            schedule_report(measured, rows)
        elif measured.kind == "failover":
            for table in failover_report(rows, None):
                console.print(table)
        else:
            console.print(summary_table(measured, rows))
        timing = measured.params.get("timing")
        if timing and measured.kind == "reconfig":
            console.print(model_check(rows, timing))
        write_outputs(measured, rows, csv_path, parquet, plots)
    except LabdError as exc:
        raise fail(str(exc)) from None
    finally:
        store.close()


def measure_compare(
    first: Annotated[str, typer.Argument(help="The run to compare against.")],
    second: Annotated[str, typer.Argument(help="The run compared.")],
    runs: RunsOption = "labd-runs.sqlite",
) -> None:
    """Two runs side by side: every figure's p50 and p99 and how much it changed."""
    from labd.measure.reconfig import compare_schedules, compare_table
    from labd.measure.runs import RunStore

    store = RunStore(runs)
    try:
        a, b = store.get(first), store.get(second)
        if a.kind != b.kind:
            raise LabdError(f"{a.name} is a {a.kind} run and {b.name} a {b.kind} run")
        compare = compare_schedules if a.kind == "schedule" else compare_table
        console.print(compare(a, store.rows(a), b, store.rows(b)))
    except LabdError as exc:
        raise fail(str(exc)) from None
    finally:
        store.close()
