"""``labd measure reconfig``: a campaign of timed reconfigurations through the daemon,
kept as a run."""

from __future__ import annotations

import random
from typing import Annotated, Any

import typer

from labd.commands.common import console, fail
from labd.commands.measure.kept import kept_run, write_outputs
from labd.commands.measure.options import (
    CheckOption,
    ControlOption,
    CsvOption,
    DeadlineScaleOption,
    DpiOption,
    FormatOption,
    FullOption,
    JitterOption,
    ParquetOption,
    PlotsOption,
    ResumeOption,
    RunsOption,
    SwitchMsOption,
    TokenOption,
    UrlOption,
    check_outcome,
    outputs,
    timing_model,
    use_deadlines,
    where_to,
)


def measure_reconfig(
    url: UrlOption = None,
    lab: Annotated[str | None, typer.Option(
        help="Measure this lab (path or packaged name) in emulation instead: its emulators "
             "and a daemon are started here, and each row gets the emulator's ground "
             "truth.")] = None,
    switch: Annotated[list[str] | None, typer.Option(
        help="Switch to measure (repeat for more; default: every switch).")] = None,
    pattern: Annotated[str, typer.Option(
        help="toggle (one pair made and broken), random (k pairs at once), permutation "
             "(every free port moved at once) or sweep (random for k = 1, 2, 4, ... all).")]
    = "toggle",
    rounds: Annotated[int, typer.Option(
        help="Reconfigurations per switch (per batch size for a sweep).")] = 100,
    k: Annotated[int, typer.Option("-k", help="Pairs per batch for random.")] = 1,
    light: Annotated[bool, typer.Option(
        help="Verify light on metered paths (--no-light: only the switch's answer).")] = True,
    seed: Annotated[int | None, typer.Option(help="Seed for the port choices.")] = None,
    name: Annotated[str | None, typer.Option(help="Name of the run (default: "
                                                  "reconfig-<UTC time>).")] = None,
    control: ControlOption = None,
    resume: ResumeOption = None,
    switch_ms: SwitchMsOption = None,
    jitter_ms: JitterOption = 0.0,
    runs: RunsOption = "labd-runs.sqlite",
    csv_path: CsvOption = None,
    parquet: ParquetOption = None,
    plots: PlotsOption = None,
    plot_format: FormatOption = "png",
    dpi: DpiOption = 150,
    full: FullOption = False,
    check: CheckOption = False,
    token: TokenOption = None,
    deadline_scale: DeadlineScaleOption = None,
) -> None:
    """Time reconfigurations through the daemon on its switches' free ports and keep them
    as a named run: a progress bar, then p50/p90/p99/max per switch and figure (--full: per
    batch size too). Ctrl-C keeps what was measured (--resume NAME goes on)."""
    from labd.measure.reconfig import (
        apply_timing,
        finishing,
        model_check,
        new_run,
        open_target,
        params_of,
        plan_campaign,
        plans_from,
        resume_run,
        run_campaign,
        summary_table,
        switch_models,
    )
    from labd.token import find_token

    use_deadlines(deadline_scale)
    style = outputs(plots=plots, plot_format=plot_format, dpi=dpi, parquet=parquet)
    timing = timing_model(switch_ms, jitter_ms, emulated=lab is not None or control is not None)
    if check and timing is None and resume is None:
        raise fail("--check holds labd's times to the emulators' timing model: give "
                   "--switch-ms (with --lab, or --url and --control)")
    outcome: dict[str, Any] = {}

    async def body(store: Any, state: dict[str, Any]) -> None:
        at_lab, at_url, at_control = where_to(resume, store, lab=lab, url=url, control=control)
        async with open_target(lab=at_lab, url=at_url, token=find_token(file=token),
                               control=at_control) as target:
            if resume is not None:
                measured, done = resume_run(store, resume, "reconfig", target, console)
                plans, wanted = plans_from(measured.params), measured.params.get("timing")
            else:
                plans, planned = await plan_campaign(
                    target, switch, pattern, rounds, k, light,
                    seed if seed is not None else random.randrange(1 << 30))
                # Before the run is made: its parameters say which switches took the model.
                await apply_timing(target, [p.switch for p in plans], timing, console,
                                   light=light)
                described = {"emulated": target.backdoor is not None,
                             "switch_models": await switch_models(
                                 target.client, [p.switch for p in plans])}
                measured, done, wanted = new_run(
                    store, name=name, kind="reconfig", target=target, planned=planned,
                    params={**params_of(plans), "timing": timing, **described}), [], timing
            state["run"] = measured
            if resume is not None:
                await apply_timing(target, [p.switch for p in plans], wanted, console,
                                   light=any(p.verify_light for p in plans))
            console.print(f"[bold]labd measure reconfig[/]: run [cyan]{measured.name}[/] on "
                          f"{target.where} ({target.lab_name}): {measured.planned} "
                          f"reconfigurations, {len(done)} already measured")
            async with finishing(store, measured):
                rows = await run_campaign(target, plans, store, measured, console, done)
        console.print(summary_table(measured, rows, full=full))
        if wanted is not None:
            console.print(model_check(rows, wanted))
        write_outputs(measured, rows, csv_path, parquet, plots, style)
        outcome.update(rows=rows, timing=wanted)

    # uvloop: the emulators run in a process of their own, and no MQTT client here.
    kept_run(runs, body, spawns=False, command="reconfig")
    if check:
        check_outcome(outcome["rows"], outcome["timing"])
