"""``labd measure failover``: failover drills on an emulated lab, kept as a run."""

from __future__ import annotations

import asyncio
import random
from typing import Annotated, Any

import typer

from labd.commands.common import console, fail, load
from labd.commands.measure.kept import kept_run, write_outputs
from labd.commands.measure.options import (
    CsvOption,
    DeadlineScaleOption,
    DpiOption,
    FormatOption,
    PlotsOption,
    RunsOption,
    outputs,
    use_deadlines,
)


def measure_failover(
    n: Annotated[int, typer.Option("-n", min=1, max=10_000,
                                   help="GPU-failure drills to run.")] = 50,
    lost: Annotated[int, typer.Option(min=0, max=10_000,
                                      help="Host-lost drills (the host just stops) to run "
                                           "after them.")] = 10,
    lab: Annotated[str, typer.Option(help="Lab (path or packaged name); its hosts must be "
                                          "emulated.")] = "failover",
    job: Annotated[str | None, typer.Option(help="Job to drill (default: the first).")] = None,
    mqtt: Annotated[str | None, typer.Option(
        help="MQTT broker the emulated hosts report to (default: the one on this machine if "
             "it answers; else they report to the daemon over HTTP).")] = None,
    signal_name: Annotated[str, typer.Option("--signal", help="GPU failure signal: xid79, "
                                                              "xid48, ecc, lost, ...")]
    = "xid79",
    seed: Annotated[int | None, typer.Option(help="Seed for the choice of victims.")] = None,
    db: Annotated[str | None, typer.Option(help="Keep the timelines in this store "
                                                "(default: a temporary one).")] = None,
    ha: Annotated[str | None, typer.Option(
        "--ha", help="PostgreSQL URL: the drills' daemon leads the lab by a lease there (its "
                     "store there too, every write fenced by epoch), and a standby (labd run "
                     "--ha, a process of its own) stands by beside it. Needs a broker.")]
    = None,
    name: Annotated[str | None, typer.Option(help="Name of the run (default: "
                                                  "failover-<UTC time>).")] = None,
    resume: Annotated[str | None, typer.Option(
        help="Go on with an interrupted run (its drills that are left).")] = None,
    runs: RunsOption = "labd-runs.sqlite",
    csv_path: CsvOption = None,
    plots: PlotsOption = None,
    plot_format: FormatOption = "png",
    dpi: DpiOption = 150,
    deadline_scale: DeadlineScaleOption = None,
) -> None:
    """Failover drills on an emulated lab: fail a member GPU (or kill its host), let the
    daemon swap in a spare and restart the job, and print each stage's p50/p99. Kept as a
    run (Ctrl-C keeps the drills done; --resume NAME goes on)."""
    from labd.agent.backends import SIGNALS
    from labd.emulation.campaign import failover_report
    from labd.emulation.campaign import measure_failover as drills
    from labd.emulation.drill import DrillResult
    from labd.lab.loader import file_sha256
    from labd.measure.reconfig import Measured, finishing, new_run, resume_run
    from labd.mqtt.client import broker_reachable, local_broker

    use_deadlines(deadline_scale)
    style = outputs(plots=plots, plot_format=plot_format, dpi=dpi)
    if signal_name not in SIGNALS:
        raise fail(f"--signal {signal_name!r}: expected one of {', '.join(SIGNALS)}")
    if mqtt is not None and (problem := broker_reachable(mqtt)) is not None:
        raise fail(f"no MQTT broker answers at {mqtt} ({problem}); start one (e.g. "
                   "mosquitto), or leave --mqtt out to have the hosts report over HTTP")
    mqtt = mqtt or local_broker()
    if ha is not None and mqtt is None:
        raise fail("--ha: a standby hears the lab's hosts through a broker, and none answers "
                   "here; give --mqtt URL")

    async def body(store: Any, state: dict[str, Any]) -> None:
        wanted: dict[str, Any] = {"lab": lab, "n": n, "lost": lost, "job": job,
                                  "signal": signal_name, "standby": ha is not None,
                  "seed": seed if seed is not None else random.randrange(1 << 30)}
        params = store.get(resume).params if resume is not None else wanted
        loaded = load(params["lab"])
        target = Measured(loaded.lab.name, file_sha256(loaded.source),
                          f"lab {loaded.source} (emulated)")
        if resume is not None:
            measured, done = resume_run(store, resume, "failover", target, console)
        else:
            measured, done = new_run(store, name=name, kind="failover", target=target,
                                     params=params, planned=n + lost), []
        state["run"] = measured
        rows = list(done)
        left = {k: params["n" if k == "gpu" else "lost"]
                - sum(1 for r in done if r["kind"] == k) for k in ("gpu", "host")}
        console.print(f"[bold]labd measure failover[/]: run [cyan]{measured.name}[/] on lab "
                      f"[cyan]{loaded.lab.name}[/], {left['gpu']} GPU failure(s) "
                      f"({params['signal']}) and {left['host']} host(s) lost to go; hosts "
                      f"report {'to ' + mqtt if mqtt else 'to the daemon over HTTP'}"
                      + (", with a standby" if ha is not None else ""))

        async def kept(result: DrillResult) -> None:
            rows.append(result.row())
            await asyncio.to_thread(store.add, measured, rows[-1])

        async with finishing(store, measured):
            # A resumed run goes on with fresh choices: the seed moves on with the drills.
            await drills(loaded, drills=left["gpu"], lost=left["host"], mqtt=mqtt,
                         console=console, seed=params["seed"] + len(done),
                         signal=params["signal"], db=db, job=params["job"], each=kept,
                         done=len(done), ha=ha)
        switch_ms = next((e.emulator.switch_time_ms for e in loaded.instrument
                          if e.emulator.switch_time_ms is not None), None)
        for table in failover_report(rows, switch_ms):
            console.print(table)
        write_outputs(measured, rows, csv_path, None, plots, style)

    kept_run(runs, body, spawns=True, command="failover")
