"""The options the measure commands share, and the timing model two of them ask for."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from labd.commands.common import fail

RunsOption = Annotated[str, typer.Option(
    "--runs", help="Where runs are kept: a SQLite file, or a PostgreSQL URL.")]
CsvOption = Annotated[Path | None, typer.Option("--csv", help="Write the raw rows here.")]
ParquetOption = Annotated[Path | None, typer.Option(help="Write the raw rows here (Parquet).")]
PlotsOption = Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")]
TokenOption = Annotated[Path | None, typer.Option(
    "--token-file", help="With --url: file holding the key for the daemon (an operator's; "
                         "default: $LABD_TOKEN, else the daemon's token file).")]
SwitchMsOption = Annotated[float | None, typer.Option(
    help="With --lab: set the emulated switches' time (ms) first, and check labd's numbers "
         "against it.")]
JitterOption = Annotated[float, typer.Option(help="With --switch-ms: the jitter (± ms).")]
ControlOption = Annotated[str | None, typer.Option(
    help="With --url: the control endpoint of the emulators that daemon drives (labd "
         "emulate prints it): ground truth beside every row, and --switch-ms.")]
ResumeOption = Annotated[str | None, typer.Option(
    help="Go on with an interrupted run (same parameters; what it measured is kept).")]
DeadlineScaleOption = Annotated[float | None, typer.Option(
    min=0.01, max=100, envvar="LABD_DEADLINE_SCALE",
    help="Multiply every wait on another process or the lab (emulators starting, hosts "
         "online, a job's first step, a recovery) by this; 3 on a loaded machine. "
         "Default 1 (docs/emulators.md, Deadlines).")]


def use_deadlines(scale: float | None) -> None:
    """Set this run's deadlines from --deadline-scale (or $LABD_DEADLINE_SCALE)."""
    from labd import deadlines
    from labd.errors import LabdError

    try:
        deadlines.use(deadlines.Deadlines.from_env(scale))
    except LabdError as exc:  # nan gets past typer's bounds
        raise fail(f"--deadline-scale: {exc}") from None


def timing_model(switch_ms: float | None, jitter_ms: float, *, emulated: bool
                 ) -> dict[str, Any] | None:
    """The timing model --switch-ms/--jitter-ms ask for; ``emulated``: there is a control
    endpoint to set it through."""
    if switch_ms is None:
        return None
    if not emulated:
        raise fail("--switch-ms sets the emulators' timing model: it needs --lab, or "
                   "--control with --url")
    if switch_ms < 0 or jitter_ms < 0 or jitter_ms > switch_ms:
        raise fail("--switch-ms and --jitter-ms: need 0 ≤ jitter ≤ switch time")
    # A flat model: the time ± jitter whatever the batch (no per-pair term).
    return {"switch_time_ms": switch_ms, "jitter_ms": jitter_ms, "per_pair_ms": 0.0}
