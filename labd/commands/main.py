"""The ``labd`` command. Every subcommand reports user mistakes as one clear message and a
non-zero exit code, never as a traceback."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from instruments.errors import InstrumentError
from labd import __version__
from labd.errors import LabdError, LabFileError
from labd.lab.file import Lab, load_lab
from labd.runtime import run

app = typer.Typer(
    name="labd",
    help="Control daemon for photonic ML-fabric testbeds: optical circuit switches, "
         "power meters, photonic meshes and GPU hosts, with faithful emulators.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Reports are wide tables: when the output is a file or a CI log, do not squeeze them to 80.
console = Console(width=None if sys.stdout.isatty() else 132)
err_console = Console(stderr=True)


def _fail(message: str, code: int = 2) -> typer.Exit:
    # escape: messages quote lab-file sections like [[instrument]], which are not markup
    err_console.print(f"[red]error:[/] {escape(message)}", highlight=False)
    return typer.Exit(code)


def _setup_logging(verbose: int) -> None:
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)


def _version(value: bool) -> None:
    if value:
        console.print(f"labd {__version__}")
        raise typer.Exit()


@app.callback()
def main_options(
    verbose: Annotated[int, typer.Option("--verbose", "-v", count=True,
                                         help="-v for info, -vv for debug (raw bytes).")] = 0,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    _setup_logging(verbose)


@app.command()
def demo(
    lab: Annotated[str, typer.Option(help="Lab to run (path or packaged name).")] = "demo",
    rounds: Annotated[int, typer.Option(min=1, max=10000,
                                        help="Make-and-break rounds per switch.")] = 12,
    seed: Annotated[int | None, typer.Option(help="Seed for the random port choices.")] = None,
    light_events: Annotated[int, typer.Option(min=0, max=10000,
                                              help="Light-verification events per switch "
                                                   "(0 skips them).")] = 20,
    serve: Annotated[bool, typer.Option("--serve", help="Keep the lab and the daemon "
                                                        "running afterwards (for labd tui), "
                                                        "and the failover lab beside it on "
                                                        "the next port (drills from the UI).")]
    = False,
    db: Annotated[str | None, typer.Option(help="Store (SQLite path or PostgreSQL URL); "
                                                "default a temporary file.")] = None,
    mqtt: Annotated[str | None, typer.Option(help="MQTT broker, mqtt://HOST[:PORT], for the "
                                                  "daemon's events and the failover drill's "
                                                  "hosts (default: one on this machine, if "
                                                  "any).")] = None,
    port: Annotated[int, typer.Option(min=0, max=65535,
                                      help="API port with --serve.")] = 8470,
    failover: Annotated[bool, typer.Option(help="Run the failover drill (it needs an MQTT "
                                                "broker).")] = True,
) -> None:
    """Run the packaged demo lab in emulation with the daemon on it: reconfigure every
    switch through the daemon, print a report of every phase set against the emulators'
    ground truth, verify light, run a fault drill and a failover drill, exit 0."""
    from labd.emulation.demo import failover_drill, run_demo

    loaded = _load(lab)
    drill = failover_drill(console, mqtt, seed)
    try:
        if failover and serve:  # before the lab is left serving
            run(drill, spawns=True)
        # Serving, it also runs the failover lab's emulated hosts, which start processes.
        code = run(run_demo(loaded, rounds=rounds, console=console, serve=serve,
                            seed=seed, light_events=light_events, db=db, mqtt=mqtt,
                            port=port), spawns=serve)
        if failover and not serve:
            run(drill, spawns=True)
    except KeyboardInterrupt:
        code = 0
    except (LabdError, InstrumentError) as exc:
        raise _fail(str(exc)) from None
    finally:
        drill.close()  # not awaited when the demo stopped first
    raise typer.Exit(code)


@app.command("run")
def run_daemon(
    lab: Annotated[str, typer.Argument(help="Lab file path, or a packaged lab name.")],
    db: Annotated[str, typer.Option(help="Store: a SQLite file path, or a PostgreSQL URL.")]
    = "labd.sqlite",
    host: Annotated[str, typer.Option(help="Address the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="API port.")] = 8470,
    token: Annotated[str | None, typer.Option(
        help="Bearer token for changes (default: $LABD_TOKEN, else a token file).")] = None,
    restore: Annotated[bool, typer.Option(
        help="On start, put back the intended circuits if a switch differs "
             "(--no-restore only reports the drift).")] = True,
    mqtt: Annotated[str | None, typer.Option(
        help="MQTT broker, mqtt://HOST[:PORT]; events and commands go through it.")] = None,
) -> None:
    """The daemon: owns every instrument of the lab, serves the API on HOST:PORT. Instruments
    marked `emulate = true` are emulated in this process."""
    from labd.client.control import Backdoor
    from labd.daemon.core import Daemon
    from labd.daemon.token import token_path
    from labd.emulation.drill import DrillService, Rig
    from labd.emulation.rig import emulated_hosts, emulated_lab, endpoint_of

    loaded = _load(lab)

    async def serve(stop: asyncio.Event) -> None:
        emulated, entries = emulated_lab(loaded)
        async with emulated:
            addresses = {e.id: endpoint_of(emulated, e) for e in entries}
            daemon = Daemon(loaded, db=db, addresses=addresses, host=host, port=port,
                            token=token, restore=restore, mqtt=mqtt)
            report = await daemon.start()
            # Without a broker, emulated hosts report to the daemon over HTTP.
            hosts = emulated_hosts(loaded, mqtt, emulated, daemon=(daemon.url, daemon.token))
            for emulated_host in hosts:  # agents with emulated GPUs, once the daemon listens
                emulated_host.start()
                emulated.hosts[emulated_host.id] = emulated_host
            backdoor = Backdoor(emulated.control_url)
            if hosts:  # drills through the API fail emulated GPUs
                daemon.drills = DrillService(Rig(daemon, backdoor, hosts))
            try:
                console.print(f"[bold]labd run[/]: lab [cyan]{loaded.lab.name}[/], "
                              f"API {daemon.url}/v1 (OpenAPI at {daemon.url}/docs), "
                              f"store {db}")
                for name, what in report.connected.items():
                    emulated_note = " (emulated)" if name in addresses else ""
                    console.print(f"  [green]ok[/]      {name:10} {what}{emulated_note}")
                for name, why in report.failed.items():
                    console.print(f"  [red]failed[/]  {name:10} {why} (retrying)")
                for name, drift in report.drift.items():
                    action = "restored" if name in report.restored else "reported"
                    console.print(f"  [yellow]drift[/]   {name:10} {len(drift.missing)} "
                                  f"missing, {len(drift.unexpected)} unexpected ({action})")
                where = "--token" if token else ("$LABD_TOKEN" if os.environ.get("LABD_TOKEN")
                                                 else str(token_path()))
                console.print(f"  changes need 'Authorization: Bearer <token>' (token: {where})")
                if hosts:
                    console.print(f"  {len(hosts)} emulated GPU host(s) report to "
                                  f"{mqtt or daemon.url + ' (HTTP)'}; failover drills: "
                                  "POST /v1/drills/failover (labd tui: d)")
                if addresses or hosts:
                    console.print(f"  emulators' control endpoint: {emulated.control_url}")
                await stop.wait()
            finally:
                if daemon.drills is not None:
                    await daemon.drills.close()
                await backdoor.close()
                for emulated_host in hosts:
                    await emulated_host.stop()
                await daemon.stop()

    # Emulated hosts start their jobs' processes.
    _run_until_signalled("the daemon", serve, spawns=any(h.emulate for h in loaded.host))


@app.command()
def tui(
    url: Annotated[str, typer.Argument(help="The daemon's URL.")] = "http://127.0.0.1:8470",
    token: Annotated[str | None, typer.Option(
        help="Token for changes (default: $LABD_TOKEN, else the token file).")] = None,
) -> None:
    """The terminal UI: port maps, hosts, the latest failover, reconfigurations and events
    of a running daemon, live; keys in the footer."""
    from labd.daemon.token import find_token
    from tui.app import LabApp

    LabApp(url, find_token(token)).run()


def _assignments(values: list[str] | None, option: str, what: str) -> dict[str, str]:
    """``NAME=VALUE`` options, each name once."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise _fail(f"{option} {value!r}: expected {what}")
        if name.strip() in out:
            raise _fail(f"{option}: {name.strip()!r} is given twice")
        out[name.strip()] = rest.strip()
    return out


def _agent_token(explicit: str | None) -> str:
    """--token, else $LABD_TOKEN, else the token file; the agent never makes one."""
    from labd.daemon.token import find_token, token_path

    found = find_token(explicit)
    if found is None:
        raise _fail(f"--daemon needs the daemon's token: give --token, set $LABD_TOKEN, or "
                    f"copy the daemon's token file to {token_path()}")
    return found


@app.command()
def agent(
    host: Annotated[str, typer.Option(help="This host's id, as in the lab file's [[host]].")],
    lab: Annotated[str, typer.Option(help="The lab's name, as in its lab file (lab.name).")],
    mqtt: Annotated[str | None, typer.Option(
        help="The lab's MQTT broker, mqtt://HOST[:PORT].")] = None,
    daemon: Annotated[str | None, typer.Option(
        help="Where the lab has no broker: the daemon's URL (http://HOST:PORT); reports go "
             "to its API.")] = None,
    token: Annotated[str | None, typer.Option(
        help="With --daemon: the daemon's token (default: $LABD_TOKEN, else the token "
             "file).")] = None,
    backend: Annotated[str, typer.Option(
        help="auto (NVML where a driver is present, else nvidia-smi), nvml, nvidia-smi, "
             "or emulated.")] = "auto",
    gpus: Annotated[int | None, typer.Option(
        min=0, max=64, help="GPUs this host should have (missing ones count as failed); "
                            "with --backend emulated, how many to emulate.")] = None,
    interval: Annotated[float, typer.Option(min=0.05, max=60,
                                            help="Heartbeat interval, seconds.")] = 1.0,
    job: Annotated[list[str] | None, typer.Option(
        help="JOB=COMMAND: the command this host runs for a job of the lab file "
             "(repeatable). The agent runs nothing else.")] = None,
    nic: Annotated[list[str] | None, typer.Option(
        help="ENDPOINT=INTERFACE: the network interface behind a NIC endpoint of the lab "
             "file, whose carrier the agent reports (repeatable).")] = None,
) -> None:
    """The GPU-host agent: reports GPU health, NIC links and job progress to the daemon
    over MQTT, and runs the host's part of the jobs it is configured for."""
    import shlex

    from labd.agent.agent import Agent, run_agent
    from labd.agent.backends import Backend, EmulatedBackend, SmiBackend
    from labd.agent.nics import SysfsNics
    from labd.agent.nvml import NvmlBackend
    from labd.errors import NvmlUnavailable

    if (mqtt is None) == (daemon is None):
        raise _fail("give one of --mqtt URL (the lab's broker) or --daemon URL (its API)")
    commands = {name: shlex.split(command) for name, command in
                _assignments(job, "--job", "JOB=COMMAND, e.g. ring4='torchrun train.py'").items()}
    interfaces = _assignments(nic, "--nic", "ENDPOINT=INTERFACE, e.g. h0.nic0=ens1f0")
    chosen: Backend
    try:
        if backend == "emulated":
            chosen = EmulatedBackend(count=gpus if gpus is not None else 8)
        elif backend == "nvidia-smi":
            chosen = SmiBackend()
        elif backend == "nvml":
            chosen = NvmlBackend()
        elif backend == "auto":
            try:
                chosen, backend = NvmlBackend(), "nvml"
            except NvmlUnavailable:
                chosen, backend = SmiBackend(), "nvidia-smi"
        else:
            raise _fail(f"backend {backend!r}: expected auto, nvml, nvidia-smi or emulated")
        runner = Agent(lab=lab, host=host, backend=chosen, mqtt=mqtt, daemon=daemon,
                       token=_agent_token(token) if daemon else None,
                       interval=interval, expected_gpus=gpus, jobs=commands,
                       nics=SysfsNics(interfaces) if interfaces else None)
    except LabdError as exc:
        raise _fail(str(exc)) from None
    console.print(f"labd agent: host {host} of lab {lab}, reporting to {mqtt or daemon} every "
                  f"{interval:g} s ({backend}); jobs: {', '.join(commands) or 'none'}; "
                  f"NICs: {', '.join(interfaces) or 'none'}")

    async def serve(stop: asyncio.Event) -> None:
        await run_agent(runner, stop)

    _run_until_signalled("the agent", serve, spawns=True)


@app.command()
def emulate(
    lab: Annotated[str, typer.Argument(help="Lab file path, or a packaged lab name (demo).")],
    control_port: Annotated[int, typer.Option(min=0, max=65535,
                                              help="Port of the control endpoint "
                                                   "(0 picks a free one).")] = 0,
    resolved: Annotated[Path | None, typer.Option(
        help="Also write a copy of the lab file pointing at the emulators.")] = None,
    mqtt: Annotated[str | None, typer.Option(
        help="MQTT broker the emulated GPU hosts' agents report to, mqtt://HOST[:PORT].")]
    = None,
) -> None:
    """Start an emulator for every `emulate = true` instrument (and an agent with emulated
    GPUs for every `emulate = true` host). Prints one JSON line per emulator, then
    {"ready": true, "control": URL}; runs until SIGINT or SIGTERM."""
    from labd.emulation.rig import emulated_hosts, emulated_lab, endpoint_of, write_resolved

    loaded = _load(lab)

    async def serve(stop: asyncio.Event) -> None:
        emulated, entries = emulated_lab(loaded, control_port=control_port)
        hosts = emulated_hosts(loaded, mqtt, emulated)
        async with emulated:
            for entry in entries:
                line = {"id": entry.id, "driver": entry.driver,
                        "endpoint": endpoint_of(emulated, entry),
                        "interfaces": emulated.endpoints[entry.id]}
                print(json.dumps(line), flush=True)
            for host in hosts:
                host.start()
                emulated.hosts[host.id] = host
                print(json.dumps({"id": host.id, "driver": "agent", "endpoint": mqtt}),
                      flush=True)
            if resolved is not None:
                write_resolved(loaded, emulated, entries, resolved)
            print(json.dumps({"ready": True, "control": emulated.control_url}), flush=True)
            try:
                await stop.wait()
            finally:
                for host in hosts:
                    await host.stop()

    # Emulated hosts start their jobs' processes.
    _run_until_signalled("the emulators", serve,
                         spawns=bool(mqtt and any(h.emulate for h in loaded.host)))


@app.command()
def probe(
    address: Annotated[str, typer.Argument(help="tcp://HOST:PORT, serial:///dev/X?baud=N or "
                                                "visa://RESOURCE")],
    command: Annotated[list[str] | None, typer.Option("--command", "-c",
                                                      help="Send this and exit "
                                                           "(repeatable).")] = None,
    write_term: Annotated[str, typer.Option(help="Write termination (escapes allowed).")]
    = "\\n",
    read_term: Annotated[str, typer.Option(help="Read termination (escapes allowed).")]
    = "\\n",
    timeout: Annotated[float, typer.Option(min=0.001, help="Reply timeout, seconds.")] = 2.0,
    tl1: Annotated[bool, typer.Option("--tl1", help="Read whole TL1 blocks (up to the ';' "
                                                    "line).")] = False,
    raw: Annotated[bool, typer.Option("--raw", help="Show replies as Python bytes.")] = False,
) -> None:
    """A raw session with one instrument: send lines, see replies and their timing."""
    from instruments.address import parse_address
    from instruments.errors import AddressError
    from labd.commands.probe import probe as run_probe
    from labd.commands.probe import unescape

    try:
        parse_address(address)
    except AddressError as exc:
        raise _fail(str(exc)) from None
    try:
        code = run(run_probe(address, commands=command or [],
                                     write_term=unescape(write_term),
                                     read_term=unescape(read_term), timeout=timeout, tl1=tl1,
                                     raw=raw, console=console))
    except KeyboardInterrupt:
        code = 0
    raise typer.Exit(code)


@app.command("check")
def check(lab: Annotated[str, typer.Argument(help="Lab file path or packaged name.")]) -> None:
    """Validate a lab file and list its instruments."""
    loaded = _load(lab)
    console.print(f"{loaded.source}: lab [cyan]{loaded.lab.name}[/], "
                  f"{len(loaded.instrument)} instrument(s)")
    for entry in loaded.instrument:
        where = "emulated" if entry.emulate else entry.address
        console.print(f"  {entry.id:12} {entry.driver:14} {where}")


measure = typer.Typer(help="Measurements on a lab: drills and campaigns that print "
                             "their statistics.", no_args_is_help=True)
app.add_typer(measure, name="measure")

RunsOption = Annotated[str, typer.Option(
    "--runs", help="Where runs are kept: a SQLite file, or a PostgreSQL URL.")]
CsvOption = Annotated[Path | None, typer.Option("--csv", help="Write the raw rows here.")]
ParquetOption = Annotated[Path | None, typer.Option(help="Write the raw rows here (Parquet).")]
PlotsOption = Annotated[Path | None, typer.Option(help="Write PNG plots into this folder.")]
TokenOption = Annotated[str | None, typer.Option(help="Token for the daemon's changes.")]
SwitchMsOption = Annotated[float | None, typer.Option(
    help="With --lab: set the emulated switches' time (ms) first, and check labd's numbers "
         "against it.")]
JitterOption = Annotated[float, typer.Option(help="With --switch-ms: the jitter (± ms).")]
ControlOption = Annotated[str | None, typer.Option(
    help="With --url: the control endpoint of the emulators that daemon drives (labd "
         "emulate prints it): ground truth beside every row, and --switch-ms.")]
ResumeOption = Annotated[str | None, typer.Option(
    help="Go on with an interrupted run (same parameters; what it measured is kept).")]


@measure.command("failover")
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
    name: Annotated[str | None, typer.Option(help="Name of the run (default: "
                                                  "failover-<UTC time>).")] = None,
    resume: Annotated[str | None, typer.Option(
        help="Go on with an interrupted run (its drills that are left).")] = None,
    runs: RunsOption = "labd-runs.sqlite",
    csv_path: CsvOption = None,
    plots: PlotsOption = None,
) -> None:
    """Failover drills on an emulated lab: fail a member GPU (or kill its host), let the
    daemon swap in a spare and restart the job, and print each stage's p50/p99. Kept as a
    run (Ctrl-C keeps the drills done; --resume NAME goes on)."""
    from labd.agent.backends import SIGNALS
    from labd.emulation.drill import DrillResult, broker_reachable, failover_report, local_broker
    from labd.emulation.drill import measure_failover as drills
    from labd.lab.file import file_sha256
    from labd.measure.reconfig import Measured, finishing, new_run, resume_run

    if signal_name not in SIGNALS:
        raise _fail(f"--signal {signal_name!r}: expected one of {', '.join(SIGNALS)}")
    if mqtt is not None and (problem := broker_reachable(mqtt)) is not None:
        raise _fail(f"no MQTT broker answers at {mqtt} ({problem}); start one (e.g. "
                    "mosquitto), or leave --mqtt out to have the hosts report over HTTP")
    mqtt = mqtt or local_broker()

    async def body(store: Any, state: dict[str, Any]) -> None:
        wanted: dict[str, Any] = {"lab": lab, "n": n, "lost": lost, "job": job,
                                  "signal": signal_name,
                  "seed": seed if seed is not None else random.randrange(1 << 30)}
        params = store.get(resume).params if resume is not None else wanted
        loaded = _load(params["lab"])
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
                      f"report {'to ' + mqtt if mqtt else 'to the daemon over HTTP'}")

        async def kept(result: DrillResult) -> None:
            rows.append(result.row())
            await asyncio.to_thread(store.add, measured, rows[-1])

        async with finishing(store, measured):
            # A resumed run goes on with fresh choices: the seed moves on with the drills.
            await drills(loaded, drills=left["gpu"], lost=left["host"], mqtt=mqtt,
                         console=console, seed=params["seed"] + len(done),
                         signal=params["signal"], db=db, job=params["job"], each=kept,
                         done=len(done))
        switch_ms = next((e.emulator.switch_time_ms for e in loaded.instrument
                          if e.emulator.switch_time_ms is not None), None)
        for table in failover_report(rows, switch_ms):
            console.print(table)
        _outputs(measured, rows, csv_path, None, plots)

    _kept_run(runs, body, spawns=True, command="failover")




@measure.command("reconfig")
def measure_reconfig(
    url: Annotated[str, typer.Option(help="The daemon to measure.")] = "http://127.0.0.1:8470",
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
    token: TokenOption = None,
) -> None:
    """Time reconfigurations through the daemon on its switches' free ports and keep them
    as a named run: a progress bar, then p50/p90/p99/max per switch, batch size and phase.
    Ctrl-C keeps what was measured (--resume NAME goes on)."""
    from labd.daemon.token import find_token
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
    )

    timing = _timing(switch_ms, jitter_ms, emulated=lab is not None or control is not None)

    async def body(store: Any, state: dict[str, Any]) -> None:
        async with open_target(lab=lab, url=url, token=find_token(token),
                               control=control) as target:
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
                measured, done, wanted = new_run(
                    store, name=name, kind="reconfig", target=target, planned=planned,
                    params={**params_of(plans), "timing": timing}), [], timing
            state["run"] = measured
            if resume is not None:
                await apply_timing(target, [p.switch for p in plans], wanted, console,
                                   light=any(p.verify_light for p in plans))
            console.print(f"[bold]labd measure reconfig[/]: run [cyan]{measured.name}[/] on "
                          f"{target.where} ({target.lab_name}): {measured.planned} "
                          f"reconfigurations, {len(done)} already measured")
            async with finishing(store, measured):
                rows = await run_campaign(target, plans, store, measured, console, done)
        console.print(summary_table(measured, rows))
        if wanted is not None:
            console.print(model_check(rows, wanted))
        _outputs(measured, rows, csv_path, parquet, plots)

    # uvloop: the emulators run in a process of their own, and no MQTT client here.
    _kept_run(runs, body, spawns=False, command="reconfig")


def _timing(switch_ms: float | None, jitter_ms: float, *, emulated: bool
            ) -> dict[str, Any] | None:
    """The timing model --switch-ms/--jitter-ms ask for; ``emulated``: there is a control
    endpoint to set it through."""
    if switch_ms is None:
        return None
    if not emulated:
        raise _fail("--switch-ms sets the emulators' timing model: it needs --lab, or "
                    "--control with --url")
    if switch_ms < 0 or jitter_ms < 0 or jitter_ms > switch_ms:
        raise _fail("--switch-ms and --jitter-ms: need 0 ≤ jitter ≤ switch time")
    # A flat model: the time ± jitter whatever the batch (no per-pair term).
    return {"switch_time_ms": switch_ms, "jitter_ms": jitter_ms, "per_pair_ms": 0.0}


def _kept_run(runs: str, body: Callable[[Any, dict[str, Any]], Coroutine[Any, Any, None]], *,
              spawns: bool, command: str) -> None:
    """Run a measurement kept as a run; Ctrl-C keeps what was measured and says how to go
    on; a user's mistake is a message."""
    from labd.measure.runs import RunStore

    try:
        store = RunStore(runs)
    except LabdError as exc:
        raise _fail(str(exc)) from None
    state: dict[str, Any] = {}
    try:
        run(body(store, state), spawns=spawns)
    except KeyboardInterrupt:
        measured = state.get("run")
        if measured is None:
            raise _fail("interrupted before anything was measured", 130) from None
        kept = len(store.rows(measured))
        console.print(f"[yellow]interrupted[/]: {kept} of {measured.planned} rows kept in run "
                      f"{measured.name}; labd measure {command} --resume {measured.name} "
                      "goes on")
        raise typer.Exit(130) from None
    except (LabdError, InstrumentError) as exc:
        raise _fail(str(exc)) from None
    finally:
        store.close()


@measure.command("schedule")
def measure_schedule(
    schedule: Annotated[str, typer.Argument(
        help="Schedule file (TOML), or the name of a packaged one (e.g. 3d-small).")],
    url: Annotated[str, typer.Option(help="The daemon to replay on.")]
    = "http://127.0.0.1:8470",
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
    token: TokenOption = None,
) -> None:
    """Replay a parallelism schedule: reconfigure the switches for each phase, on demand or
    speculatively, and report for each idle window whether the reconfiguration was hidden,
    how far it overran, and the time added per iteration. Kept as a run."""
    from labd.daemon.token import find_token
    from labd.measure.reconfig import apply_timing, finishing, new_run, open_target, resume_run
    from labd.measure.schedule import check_switches, load_schedule

    modes = {"both": ["on demand", "speculative"], "on-demand": ["on demand"],
             "speculative": ["speculative"]}.get(mode)
    if modes is None:
        raise _fail(f"--mode {mode!r}: expected on-demand, speculative or both")
    if iterations < 1:
        raise _fail(f"--iterations {iterations}: need at least 1")
    timing = _timing(switch_ms, jitter_ms, emulated=lab is not None or control is not None)

    async def body(store: Any, state: dict[str, Any]) -> None:
        async with open_target(lab=lab, url=url, token=find_token(token),
                               control=control) as target:
            if resume is not None:
                measured, done = resume_run(store, resume, "schedule", target, console)
                params = measured.params
                plan = load_schedule(params["file"])
            else:
                plan = load_schedule(schedule)
                await check_switches(target.client, plan)
                await apply_timing(target, plan.switches(), timing, console)
                params = {"file": schedule, "schedule": plan.name, "iterations": iterations,
                          "modes": modes, "timing": timing}
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
        _schedule_report(measured, rows)
        _outputs(measured, rows, csv_path, parquet, plots)

    _kept_run(runs, body, spawns=False, command="schedule")


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


def _schedule_report(measured: Any, rows: list[dict[str, Any]]) -> None:
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


@measure.command("make-schedule")
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
        raise _fail(str(exc)) from None
    out.write_text(to_toml(made), encoding="utf-8")
    gaps = idle_gaps(made)
    console.print(f"wrote {out}: {made.name}, {len(made.phase)} phases, "
                  f"{made.iteration_ms} ms per iteration, idle windows "
                  f"{min(gaps):g}-{max(gaps):g} ms")


def _outputs(measured: Any, rows: list[dict[str, Any]], csv_path: Path | None,
             parquet: Path | None, plots: Path | None) -> None:
    from labd.measure.plots import failover_plots, reconfig_plots, schedule_plots
    from labd.measure.reconfig import export

    written = export(measured, rows, csv_path=csv_path, parquet_path=parquet)
    if plots is not None:
        draw = {"schedule": schedule_plots, "failover": failover_plots}.get(
            measured.kind, reconfig_plots)
        written += [str(p) for p in draw(measured.name, rows, plots)]
    for path in written:
        console.print(f"  wrote {path}")


@measure.command("runs")
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


@measure.command("show")
def measure_show(
    name: Annotated[str, typer.Argument(help="The run.")],
    runs: RunsOption = "labd-runs.sqlite",
    csv_path: CsvOption = None,
    parquet: ParquetOption = None,
    plots: PlotsOption = None,
) -> None:
    """A kept run's summary (and its rows exported, its plots drawn)."""
    from labd.emulation.drill import failover_report
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
            _schedule_report(measured, rows)
        elif measured.kind == "failover":
            for table in failover_report(rows, None):
                console.print(table)
        else:
            console.print(summary_table(measured, rows))
        timing = measured.params.get("timing")
        if timing and measured.kind == "reconfig":
            console.print(model_check(rows, timing))
        _outputs(measured, rows, csv_path, parquet, plots)
    except LabdError as exc:
        raise _fail(str(exc)) from None
    finally:
        store.close()


@measure.command("compare")
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
        raise _fail(str(exc)) from None
    finally:
        store.close()


def _run_until_signalled(what: str, body: Callable[[asyncio.Event], Awaitable[None]], *,
                         spawns: bool = False) -> None:
    """Run a long-lived service until SIGINT or SIGTERM, then let it shut down cleanly;
    a start-up failure is one clear message."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await body(stop)

    try:
        run(main(), spawns=spawns)
    except OSError as exc:
        raise _fail(f"cannot start {what}: {exc}") from None
    except LabdError as exc:
        raise _fail(str(exc)) from None


def _load(lab: str) -> Lab:
    try:
        return load_lab(lab)
    except LabFileError as exc:
        raise _fail("the lab file has problems:\n  " + "\n  ".join(exc.problems)) from None


def main() -> None:
    app()
