"""The options the measure commands share, and the timing model two of them ask for."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from labd.commands.common import fail

if TYPE_CHECKING:
    from labd.measure.plots import PlotStyle

#: The exit status of a run whose truth check (--check) failed: apart from 2, a mistake in
#: the command line, and 130, an interruption.
CHECK_FAILED = 1

RunsOption = Annotated[str, typer.Option(
    "--runs", help="Where runs are kept: a SQLite file, or a PostgreSQL URL.")]
CsvOption = Annotated[Path | None, typer.Option("--csv", help="Write the raw rows here.")]
ParquetOption = Annotated[Path | None, typer.Option(help="Write the raw rows here (Parquet).")]
PlotsOption = Annotated[Path | None, typer.Option(
    help="Write plots into this folder (--format, --dpi).")]
FormatOption = Annotated[str, typer.Option(
    "--format", help="With --plots: png, svg or pdf (figures a paper column or page wide).")]
DpiOption = Annotated[int, typer.Option(
    min=50, max=1200, help="With --plots: the resolution of PNG plots (300 for print).")]
FullOption = Annotated[bool, typer.Option(
    "--full", help="Every batch size on a row of its own (default: one row per switch "
                   "and figure).")]
CheckOption = Annotated[bool, typer.Option(
    "--check", help=f"Exit {CHECK_FAILED} when labd's times are more than 1 ms from the "
                    "emulator's truth at p99 (the timing-model check), or there is no truth "
                    "to check.")]
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
    help="Go on with an interrupted run, on the lab or daemon it began on (same parameters; "
         "what it measured is kept).")]
UrlOption = Annotated[str | None, typer.Option(
    help="The daemon to measure [default: http://127.0.0.1:8470].")]
DeadlineScaleOption = Annotated[float | None, typer.Option(
    min=0.01, max=100, envvar="LABD_DEADLINE_SCALE",
    help="Multiply every wait on another process or the lab (emulators starting, hosts "
         "online, a job's first step, a recovery) by this; 3 on a loaded machine. "
         "Default 1 (docs/emulators.md, Deadlines).")]


def where_to(resume: str | None, runs: Any, *, lab: str | None, url: str | None,
             control: str | None) -> tuple[str | None, str, str | None]:
    """The lab, URL and control endpoint a campaign measures: a resumed run's own (another
    named on the command line is refused), else as given."""
    from labd.measure.reconfig import DEFAULT_URL, resume_target

    if resume is None:
        return lab, url or DEFAULT_URL, control
    kept = resume_target(runs.get(resume), lab=lab, url=url, control=control)
    return kept.get("lab"), kept.get("url") or DEFAULT_URL, kept.get("control")


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


def outputs(*, plots: Path | None, plot_format: str, dpi: int, parquet: Path | None = None
            ) -> PlotStyle:
    """The plots' style, after checking that what the outputs asked for need is installed:
    before anything is measured, a missing package or a bad format is one message."""
    from labd.errors import LabdError
    from labd.measure.extras import require
    from labd.measure.plots import PlotStyle

    style = PlotStyle(plot_format.lower(), dpi)
    try:
        style.check()
        require(plots=plots is not None, parquet=parquet is not None)
    except LabdError as exc:
        raise fail(str(exc)) from None
    return style


def check_outcome(rows: list[dict[str, Any]], timing: dict[str, Any] | None) -> None:
    """--check: exit CHECK_FAILED, saying why, where the timing-model check fails."""
    from labd.measure.reconfig import check_model

    if timing is None:
        raise fail("--check: this run has no timing model to check against (measure with "
                   "--switch-ms, on --lab or --url with --control)")
    checks = check_model(rows, timing)
    problems = [p for c in checks if (p := c.problem()) is not None]
    if not checks:
        problems = ["no switch took the timing model"]
    if problems:
        raise fail("the truth check failed: " + "; ".join(problems), CHECK_FAILED)
