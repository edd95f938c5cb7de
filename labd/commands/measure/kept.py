"""A measurement kept as a run: running it so that Ctrl-C keeps what was measured, and
writing its rows and plots."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from labd.commands.common import console, fail
from labd.errors import LabdError
from labd.runtime import run

if TYPE_CHECKING:
    from labd.measure.plots import PlotStyle


def kept_run(runs: str, body: Callable[[Any, dict[str, Any]], Coroutine[Any, Any, None]], *,
             spawns: bool, command: str) -> None:
    """Run a measurement kept as a run; Ctrl-C keeps what was measured and says how to go
    on; a user's mistake is a message."""
    from instruments.errors import InstrumentError
    from labd.measure.runs import RunStore

    try:
        store = RunStore(runs)
    except LabdError as exc:
        raise fail(str(exc)) from None
    state: dict[str, Any] = {}
    try:
        run(body(store, state), spawns=spawns)
    except KeyboardInterrupt:
        measured = state.get("run")
        if measured is None:
            raise fail("interrupted before anything was measured", 130) from None
        kept = len(store.rows(measured))
        console.print(f"[yellow]interrupted[/]: {kept} of {measured.planned} rows kept in run "
                      f"{measured.name}; labd measure {command} --resume {measured.name} "
                      "goes on")
        raise typer.Exit(130) from None
    except (LabdError, InstrumentError) as exc:
        raise fail(str(exc)) from None
    finally:
        store.close()


def write_outputs(measured: Any, rows: list[dict[str, Any]], csv_path: Path | None,
                  parquet: Path | None, plots: Path | None, style: PlotStyle | None = None
                  ) -> None:
    """The run's rows to CSV and Parquet, its plots into a folder, as asked; each file
    written is listed."""
    from labd.measure.availability_plots import availability_plots
    from labd.measure.plots import PlotStyle, failover_plots, reconfig_plots, schedule_plots
    from labd.measure.reconfig import export

    written = export(measured, _same_stages(rows), csv_path=csv_path, parquet_path=parquet)
    if plots is not None:
        draw = {"schedule": schedule_plots, "failover": failover_plots,
                "availability": availability_plots}.get(measured.kind, reconfig_plots)
        written += [str(p) for p in draw(measured, rows, plots, style or PlotStyle())]
    for path in written:
        console.print(f"  wrote {path}")


def _same_stages(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drill rows with every stage a column, empty where a drill did not reach it: a CSV's
    columns come from its first row, and a lost host reports no failure."""
    from labd.vocabulary import STAGES

    stages = (*STAGES[1:], "light_truth")
    return [{**r, "ms": {s: r["ms"].get(s) for s in stages}} if isinstance(r.get("ms"), dict)
            else r for r in rows]
