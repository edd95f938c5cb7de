"""``labd measure schedule`` (replay a parallelism schedule, kept as a run) and
``labd measure make-schedule`` (write a synthetic one)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from labd.commands.common import console, fail
from labd.commands.measure.kept import kept_run, write_outputs
from labd.commands.measure.options import (
    ControlOption,
    CsvOption,
    DeadlineScaleOption,
    DpiOption,
    FormatOption,
    JitterOption,
    ParquetOption,
    PlotsOption,
    ResumeOption,
    RunsOption,
    SwitchMsOption,
    TokenOption,
    UrlOption,
    outputs,
    timing_model,
    use_deadlines,
    where_to,
)
from labd.errors import LabdError


def measure_schedule(
    schedule: Annotated[str, typer.Argument(
        help="Schedule file (TOML), or the name of a packaged one (e.g. 3d-small).")],
    url: UrlOption = None,
    lab: Annotated[str | None, typer.Option(
        help="Replay on this lab (path or packaged name) in emulation instead.")] = None,
    iterations: Annotated[int, typer.Option(help="Iterations to replay per mode.")] = 3,
    mode: Annotated[str, typer.Option(
        help="on-demand (reconfigure when a phase is due), speculative (as soon as the "
             "previous phase's traffic ends) or both.")] = "both",
    control: ControlOption = None,
    switch_ms: SwitchMsOption = None,
    jitter_ms: JitterOption = 0.0,
    name: Annotated[str | None, typer.Option(help="Name of the run.")] = None,
    resume: ResumeOption = None,
    runs: RunsOption = "labd-runs.sqlite",
    csv_path: CsvOption = None,
    parquet: ParquetOption = None,
    plots: PlotsOption = None,
    plot_format: FormatOption = "png",
    dpi: DpiOption = 150,
    token: TokenOption = None,
    deadline_scale: DeadlineScaleOption = None,
) -> None:
    """Replay a parallelism schedule: reconfigure the switches for each phase, on demand or
    speculatively, and report for each idle window whether the reconfiguration was hidden,
    how far it overran, and the time added per iteration. Kept as a run."""
    from labd.measure.reconfig import (
        apply_timing,
        finishing,
        new_run,
        open_target,
        resume_run,
        switch_models,
    )
    from labd.measure.schedule import check_switches, load_schedule
    from labd.token import find_token

    use_deadlines(deadline_scale)
    style = outputs(plots=plots, plot_format=plot_format, dpi=dpi, parquet=parquet)
    modes = {"both": ["on demand", "speculative"], "on-demand": ["on demand"],
             "speculative": ["speculative"]}.get(mode)
    if modes is None:
        raise fail(f"--mode {mode!r}: expected on-demand, speculative or both")
    if iterations < 1:
        raise fail(f"--iterations {iterations}: need at least 1")
    timing = timing_model(switch_ms, jitter_ms, emulated=lab is not None or control is not None)

    async def body(store: Any, state: dict[str, Any]) -> None:
        at_lab, at_url, at_control = where_to(resume, store, lab=lab, url=url, control=control)
        async with open_target(lab=at_lab, url=at_url, token=find_token(file=token),
                               control=at_control) as target:
            if resume is not None:
                measured, done = resume_run(store, resume, "schedule", target, console)
                params = measured.params
                plan = load_schedule(params["file"])
            else:
                plan = load_schedule(schedule)
                await check_switches(target.client, plan)
                await apply_timing(target, plan.switches(), timing, console)
                params = {"file": schedule, "schedule": plan.name, "iterations": iterations,
                          "modes": modes, "timing": timing,
                          "emulated": target.backdoor is not None,
                          "switch_models": await switch_models(target.client,
                                                               plan.switches())}
                measured, done = new_run(store, name=name, kind="schedule", target=target,
                                         params=params, planned=iterations * len(modes)
                                         * len(plan.phase)), []
            state["run"] = measured
            if resume is not None:
                await apply_timing(target, plan.switches(), params.get("timing"), console)
            console.print(f"[bold]labd measure schedule[/]: run [cyan]{measured.name}[/]: "
                          f"{plan.name} ({len(plan.phase)} phases, {plan.iteration_ms} ms "
                          f"per iteration) on {target.where}, {params['iterations']} "
                          f"iteration(s) {' then '.join(params['modes'])}")
            async with finishing(store, measured):
                rows = await _replay_modes(target, plan, params, store, measured, done)
        schedule_report(measured, rows)
        write_outputs(measured, rows, csv_path, parquet, plots, style)

    kept_run(runs, body, spawns=False, command="schedule")


async def _replay_modes(target: Any, plan: Any, params: dict[str, Any], store: Any,
                        measured: Any, done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from labd.measure.reconfig import keep, progress_bar
    from labd.measure.schedule import replay

    rows = list(done)
    with progress_bar(console) as progress:
        task = progress.add_task(plan.name, total=measured.planned, completed=len(rows))
        for mode in params["modes"]:
            progress.update(task, description=f"{plan.name} {mode}")
            skip = sum(1 for r in rows if r["mode"] == mode)
            await keep(store, measured, rows, replay(
                target.client, plan, iterations=params["iterations"],
                speculative=mode == "speculative", skip=skip), progress, task)
    return rows


def schedule_report(measured: Any, rows: list[dict[str, Any]]) -> None:
    from labd.measure.schedule import schedule_summary

    table = Table(title=f"run {measured.name}: {measured.params['schedule']}, windows that "
                        "needed a reconfiguration; ms")
    for column in ("mode", "iterations", "windows", "hidden", "idle window p50",
                   "reconfig p50", "overrun p50", "overrun p99", "added per iteration"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for s in schedule_summary(rows):
        table.add_row(s["mode"], str(s["iterations"]), str(s["windows"]),
                      f"{s['hidden'] * 100:.0f} %", f"{s['window_p50']:.3f}",
                      f"{s['reconfig_p50']:.3f}", f"{s['overrun_p50']:.3f}",
                      f"{s['overrun_p99']:.3f}", f"{s['added_per_iteration']:.2f}")
    console.print(table)


def make_schedule(
    out: Annotated[Path, typer.Argument(help="The schedule file to write (TOML).")],
    pp: Annotated[int, typer.Option(help="Pipeline-parallel stages.")] = 2,
    dp: Annotated[int, typer.Option(help="Data-parallel replicas.")] = 2,
    tp: Annotated[int, typer.Option(help="Tensor-parallel shards.")] = 2,
    microbatches: Annotated[int, typer.Option(help="Microbatches per iteration.")] = 4,
    layers: Annotated[int, typer.Option(help="Layers per pipeline stage.")] = 2,
    switch: Annotated[str, typer.Option(help="The switch the GPUs are cabled to.")] = "ocs1",
    ports: Annotated[int, typer.Option(
        help="Ingress ports of that switch (GPU g on ingress g+1, egress ports+g+1).")] = 16,
    compute_ms: Annotated[float, typer.Option(help="Compute between phases (idle "
                                                   "network).")] = 2.0,
    tp_ms: Annotated[float, typer.Option(help="A tensor-parallel all-reduce.")] = 1.0,
    pp_ms: Annotated[float, typer.Option(help="A pipeline send.")] = 2.0,
    dp_ms: Annotated[float, typer.Option(help="The gradient all-reduce.")] = 10.0,
) -> None:
    """Write a synthetic 3D-parallel schedule (PP x DP x TP GPUs on one switch) for
    labd measure schedule."""
    from labd.measure.schedule import idle_gaps, synthetic, to_toml

    try:
        made = synthetic(pp=pp, dp=dp, tp=tp, microbatches=microbatches, layers=layers,
                         ingress=ports, switch=switch, compute_ms=compute_ms, tp_ms=tp_ms,
                         pp_ms=pp_ms, dp_ms=dp_ms)
    except LabdError as exc:
        raise fail(str(exc)) from None
    out.write_text(to_toml(made), encoding="utf-8")
    gaps = idle_gaps(made)
    console.print(f"wrote {out}: {made.name}, {len(made.phase)} phases, "
                  f"{made.iteration_ms} ms per iteration, idle windows "
                  f"{min(gaps):g}-{max(gaps):g} ms")
