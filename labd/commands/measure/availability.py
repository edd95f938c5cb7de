"""``labd measure availability``: a failure profile replayed on an emulated lab through
labd's recovery, and the training time each way of recovering keeps, kept as a run."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
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


def _pairs(values: list[str] | None, option: str) -> dict[str, float]:
    """``KEY=NUMBER`` options into a mapping; a malformed one is a message."""
    out: dict[str, float] = {}
    for value in values or []:
        key, sep, number = value.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            out[key.strip()] = float(number)
        except ValueError:
            raise fail(f"{option} {value!r}: expected NAME=NUMBER") from None
    return out


def measure_availability(
    profile: Annotated[str, typer.Option(
        help="Failure profile: llama3-405b or tpuv4 (built in), or a TOML file of counts "
             "or rates, or a CSV of timestamped events (docs/measure.md, Availability).")]
    = "llama3-405b",
    lab: Annotated[str, typer.Option(help="Lab (path or packaged name) whose emulated hosts "
                                          "the failures are driven on.")] = "failover",
    job: Annotated[str | None, typer.Option(help="Job to fail members of (default: the "
                                                 "lab's first).")] = None,
    mqtt: Annotated[str | None, typer.Option(
        help="MQTT broker the emulated hosts report to (default: the one on this machine if "
             "it answers; else they report to the daemon over HTTP).")] = None,
    timelines: Annotated[Path | None, typer.Option(
        help="Drive nothing: take the recoveries from this JSON of a daemon's recorded "
             "failovers (GET /v1/failovers on a real rack).")] = None,
    drive: Annotated[int, typer.Option(min=1, max=10_000, help="Failures of the modelled "
                                       "run to drive on the rig.")] = 24,
    minutes: Annotated[float, typer.Option(min=0.05, max=600, help="Replay the modelled "
                                           "run in this many minutes (the compression).")]
    = 2.0,
    gpus: Annotated[int | None, typer.Option(min=1, help="GPUs of the modelled job (default: "
                                             "the profile's source's).")] = None,
    hours: Annotated[float | None, typer.Option(min=0.001, help="Hours of the modelled job "
                                                "(default: the source's).")] = None,
    gpus_per_host: Annotated[int | None, typer.Option(
        min=1, help="GPUs per host: a failure takes its host out (default: the profile's; 8 "
                    "for llama3-405b, 4 chips for tpuv4).")] = None,
    checkpoint_min: Annotated[float, typer.Option(min=0.001, help="Minutes between "
                                                  "checkpoints.")] = 30.0,
    restart: Annotated[list[str] | None, typer.Option(
        help="A framework restart component in s (checkpoint_load, communicators, warmup; "
             "TrainMover's by default): NAME=S, repeat.")] = None,
    link_up: Annotated[str, typer.Option(
        "--link-up-s", help="NICs' link-up after the switch, s; 'mixnet' for MixNet's "
                            "5.67 s.")] = "0",
    standby_s: Annotated[float | None, typer.Option(
        min=0, help="Moving a job onto a standby host without a fabric (re-cabling, "
                    "scheduler), s (default: 121.2, the rest of TrainMover's 6.47 min).")]
    = None,
    repair: Annotated[list[str] | None, typer.Option(
        "--repair-h", help="A class's repair time, hours: CLASS=H, repeat (default 4 for a "
                           "GPU or host, 0 for the rest).")] = None,
    spares: Annotated[int | None, typer.Option(min=0, help="Spare hosts in the pool "
                                               "(default: 6 % of the job's).")] = None,
    rate_scale: Annotated[float, typer.Option(min=0.001, max=1000, help="Scale every "
                                              "failure rate by this.")] = 1.0,
    traces: Annotated[int, typer.Option(min=10, max=10_000, help="Draws of the failure "
                                        "process the intervals are over.")] = 200,
    seed: Annotated[int | None, typer.Option(help="Seed of the trace, the sample driven "
                                                  "and the victims.")] = None,
    name: Annotated[str | None, typer.Option(help="Name of the run (default: "
                                                  "availability-<UTC time>).")] = None,
    resume: Annotated[str | None, typer.Option(
        help="Go on with an interrupted run (its failures that are left).")] = None,
    runs: RunsOption = "labd-runs.sqlite",
    csv_path: CsvOption = None,
    plots: PlotsOption = None,
    plot_format: FormatOption = "png",
    dpi: DpiOption = 150,
    deadline_scale: DeadlineScaleOption = None,
) -> None:
    """Replay a failure profile on an emulated lab through labd's real recovery, then model
    a training job's effective training time (ETTR) under three strategies: optical spare
    swap (labd, measured), checkpoint restart after repair, standby without a fabric. Kept
    as a run (Ctrl-C keeps what was driven; --resume NAME goes on)."""
    from labd.errors import LabdError
    from labd.measure.ettr import (
        MIXNET_LINK_UP_S,
        STANDBY_DEFAULT_S,
        ModelInputs,
        check_job,
        replay_trace,
    )
    from labd.measure.failures import load_profile
    from labd.mqtt.client import broker_reachable, local_broker

    use_deadlines(deadline_scale)
    style = outputs(plots=plots, plot_format=plot_format, dpi=dpi)
    if link_up.strip().lower() == "mixnet":
        link_up_s = MIXNET_LINK_UP_S
    else:
        try:
            link_up_s = float(link_up)
        except ValueError:
            raise fail(f"--link-up-s {link_up!r}: expected seconds or 'mixnet'") from None
    given = [option for option, value in (
        ("job", gpus is not None or hours is not None or gpus_per_host is not None),
        ("restart", restart),
        ("checkpoint", checkpoint_min != 30.0), ("link-up", link_up_s != 0),
        ("standby", standby_s is not None), ("repair", repair), ("spares", spares is not None),
        ("rate", rate_scale != 1.0)) if value]
    recovered = _timelines(timelines) if timelines is not None else None
    if mqtt is not None and recovered is None and \
            (problem := broker_reachable(mqtt)) is not None:
        raise fail(f"no MQTT broker answers at {mqtt} ({problem}); start one (e.g. "
                   "mosquitto), or leave --mqtt out to have the hosts report over HTTP")
    mqtt = mqtt or (local_broker() if recovered is None else None)

    def plan_params() -> dict[str, Any]:
        from labd.measure.availability import plan_replay
        from labd.measure.availability_report import (
            inputs_params,
            profile_params,
            rig_link_up,
        )

        # The link-up the lab's hosts play is in every recovery the replay measures: the
        # model must not add one of its own on top.
        played = rig_link_up(load(lab)) if recovered is None else None
        if link_up_s and played not in (None, 0.0):
            shown = '"mixnet"' if played == "mixnet" else f"up to {played:g} ms"
            raise fail(f"--link-up-s {link_up}: lab {lab}'s hosts play NIC link-up already "
                       f"(link_up_ms {shown}), so the measured recoveries hold it; leave "
                       "--link-up-s out, or set the hosts' link_up_ms to 0")

        try:
            chosen = load_profile(profile)
            restart_s = _pairs(restart, "--restart")
            inputs = ModelInputs(
                gpus=gpus or chosen.gpus, hours=hours or chosen.hours,
                gpus_per_host=gpus_per_host or chosen.per_host, checkpoint_min=checkpoint_min,
                restart_s=_restart(restart_s), link_up_s=link_up_s,
                repair_h=_pairs(repair, "--repair-h"), spares=spares, rate_scale=rate_scale,
                standby_s=STANDBY_DEFAULT_S if standby_s is None else standby_s)
            inputs.check()
            inputs.repair_of(chosen)
            check_job(chosen, inputs)
            use_seed = seed if seed is not None else random.randrange(1 << 30)
            trace = replay_trace(chosen, inputs, use_seed)
            plan = plan_replay(chosen, trace, inputs, drive=drive, minutes=minutes,
                               seed=use_seed)
        except LabdError as exc:
            raise fail(str(exc)) from None
        if not plan.failures and recovered is None:
            raise fail(f"the draw of {len(trace)} failure(s) of profile {chosen.name} on "
                       f"{inputs.gpus:,} GPUs over {inputs.hours:g} h has none with a recovery "
                       "path on the rig to drive: model a longer or larger job (--hours, "
                       "--gpus, --rate-scale) or draw again (--seed)")
        return {"profile_spec": profile, "lab": lab, "job": job, "seed": use_seed,
                "traces": traces, "drive": drive, "minutes": minutes, "given": given,
                "compression": None if recovered is not None else plan.compression,
                "modelled": plan.modelled, "timelines": str(timelines) if timelines else None,
                "profile": profile_params(chosen), "model": inputs_params(inputs),
                "emulated": recovered is None, "rig_link_up": played}

    wanted = plan_params() if resume is None else None

    async def body(store: Any, state: dict[str, Any]) -> None:
        from labd.lab.loader import file_sha256
        from labd.measure.availability import plan_replay, replay
        from labd.measure.availability_report import (
            availability_report,
            inputs_of,
            model_of,
            profile_of,
        )
        from labd.measure.reconfig import Measured, finishing, new_run, resume_run

        params = store.get(resume).params if resume is not None else wanted
        assert params is not None
        if params.get("timelines"):
            target = Measured(Path(params["timelines"]).stem, "",
                              f"timelines {params['timelines']}")
        else:
            loaded = load(params["lab"])
            target = Measured(loaded.lab.name, file_sha256(loaded.source),
                              f"lab {loaded.source} (emulated)")
        chosen, inputs = profile_of(params), inputs_of(params)
        plan = plan_replay(chosen, replay_trace(chosen, inputs, params["seed"]), inputs,
                           drive=params["drive"], minutes=params["minutes"],
                           seed=params["seed"])
        planned = len(recovered) if recovered is not None else len(plan.failures)
        if resume is not None:
            measured, done = resume_run(store, resume, "availability", target, console)
        else:
            measured, done = new_run(store, name=name, kind="availability", target=target,
                                     params=params, planned=planned), []
        state["run"] = measured
        rows = list(done)

        async def kept(row: dict[str, Any]) -> None:
            rows.append(row)
            await asyncio.to_thread(store.add, measured, row)

        async with finishing(store, measured):
            if recovered is not None:
                for row in recovered[len(done):]:
                    await kept(row)
            else:
                driven = plan.driven()
                console.print(
                    f"[bold]labd measure availability[/]: run [cyan]{measured.name}[/], "
                    f"profile [cyan]{chosen.name}[/] on {inputs.gpus:,} GPUs for "
                    f"{inputs.hours:g} h: {sum(plan.modelled.values())} failures modelled, "
                    f"{len(plan.failures)} to drive on lab [cyan]{target.lab_name}[/] "
                    f"({', '.join(f'{k} {v}' for k, v in driven.items() if v)}), time "
                    f"compressed {plan.compression:,.0f}x ({params['minutes']:g} min); "
                    f"hosts report {'to ' + mqtt if mqtt else 'to the daemon over HTTP'}")
                await replay(load(params["lab"]), plan, mqtt=mqtt, console=console,
                             seed=params["seed"], job=params["job"], each=kept,
                             skip=len(done))
        with console.status("modelling the job and its sweeps"):
            model = await asyncio.to_thread(model_of, measured.params, rows)
        for table in availability_report(measured, rows, model):
            console.print(table)
        write_outputs(measured, rows, csv_path, None, plots, style)

    kept_run(runs, body, spawns=recovered is None, command="availability")


def _restart(given: dict[str, float]) -> dict[str, float]:
    from labd.measure.ettr import RESTART_DEFAULTS_S

    unknown = sorted(set(given) - set(RESTART_DEFAULTS_S))
    if unknown:
        raise fail(f"--restart: no component {', '.join(unknown)} (components: "
                   f"{', '.join(RESTART_DEFAULTS_S)})")
    return {**RESTART_DEFAULTS_S, **given}


def _timelines(path: Path) -> list[dict[str, Any]]:
    """A daemon's recorded failovers (``GET /v1/failovers``) as drill rows: the trigger
    says the path, ``since_failure_ms`` the stages."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise fail(f"--timelines {path}: cannot read it as JSON ({exc})") from None
    if isinstance(data, dict):
        data = data.get("failovers", data.get("items"))
    if not isinstance(data, list):
        raise fail(f"--timelines {path}: expected a list of failovers (GET /v1/failovers)")
    paths = {"gpu-failed": "gpu", "host-lost": "host"}
    rows = [{"kind": paths[f["trigger"]], "outcome": f.get("outcome"),
             "member": f.get("member"), "failover": f.get("id"),
             "ms": f.get("since_failure_ms") or {}, "class": None}
            for f in data if isinstance(f, dict) and f.get("trigger") in paths]
    if not any(r["outcome"] == "recovered" for r in rows):
        raise fail(f"--timelines {path}: no recovered GPU failure or host loss in it")
    return rows
