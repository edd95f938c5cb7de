"""The GPU-host agent as a command: ``labd agent``, and ``python -m labd.agent`` on a host
that runs only the agent.

It runs on every GPU host, so it loads none of the daemon, its store, the drivers or the
web server: only typer and rich here, and the agent's own parts once it runs
(docs/architecture.md). The daemon's token is looked up as the daemon keeps it."""

from __future__ import annotations

import shlex
from functools import partial
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from labd.errors import LabdError, NvmlUnavailable
from labd.terminal import console, fail, run_until_signalled

if TYPE_CHECKING:
    from labd.agent.metrics import MetricsServer
    from labd.agent.reporter import Agent
    from labd.mqtt.credentials import BusSettings

# The same consoles as the labd command's: a wide line when the output is a file or a log.


def agent(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="This host's id, as in the lab file's \\[\\[host]].")],
    lab: Annotated[str, typer.Option(help="The lab's name, as in its lab file (lab.name).")],
    mqtt: Annotated[str | None, typer.Option(
        help="The lab's MQTT broker, mqtt://HOST[:PORT] (mqtts:// for TLS).")] = None,
    mqtt_credentials: Annotated[str | None, typer.Option(
        help="This host's credentials file (labd broker-config writes hosts/HOST.toml): its "
             "broker login and the key that signs what it sends. Without one the daemon "
             "refuses the host's messages.")] = None,
    instance: Annotated[str | None, typer.Option(
        help="The lab instance the daemon runs (labd run --instance; default: the "
             "credentials file's, else none).")] = None,
    daemon: Annotated[str | None, typer.Option(
        help="Where the lab has no broker: the daemon's URL (http://HOST:PORT); reports go "
             "to its API.")] = None,
    token_file: Annotated[str | None, typer.Option(
        help="With --daemon: a file holding this host's key (an access-file key with "
             "host = HOST) or the daemon's token (default: $LABD_TOKEN, else the daemon's "
             "token file).")] = None,
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
    log_level: Annotated[str | None, typer.Option(
        help="Log levels: one for every logger, then NAME=LEVEL for some, e.g. "
             "info,labd.agent=debug [default: warning; labd -v: info, -vv: debug].")] = None,
    log_format: Annotated[str, typer.Option(
        help="human (on a terminal: rich; elsewhere one plain line each) or json (one "
             "object per line, for collectors).")] = "human",
    log_file: Annotated[str | None, typer.Option(
        help="Write the logs to this file instead of stderr (rotated at 10 MiB, 5 "
             "kept).")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        min=0, max=65535,
        help="Serve the agent's own GET /metrics for Prometheus on this port (0: any free "
             "one, printed at start) [default: none].")] = None,
    metrics_host: Annotated[str, typer.Option(
        help="The address --metrics-port listens on; another than loopback lets the "
             "network scrape it (and read the host's GPU health).")] = "127.0.0.1",
) -> None:
    """The GPU-host agent: reports GPU health, NIC links and job progress to the daemon
    over MQTT, and runs the host's part of the jobs it is configured for."""
    from labd.agent.backends import Backend, EmulatedBackend, SmiBackend
    from labd.agent.nics import SysfsNics
    from labd.agent.nvml import NvmlBackend
    from labd.agent.reporter import Agent
    from labd.logs import LogSettingsError, add_secrets, configure, json_consoles, level_for
    from labd.terminal import err_console

    # -v of the labd command (python -m labd.agent has none)
    options = ctx.find_root().obj
    verbose = int(options.get("verbose", 0)) if isinstance(options, dict) else 0
    try:
        configure(level_for(verbose, log_level), log_format, log_file)
    except LogSettingsError as exc:
        raise fail(f"log options: {exc}") from None
    if log_format == "json":  # what it prints on start, and its errors: JSON lines too
        json_consoles(console, err_console, "labd.agent")
    if (mqtt is None) == (daemon is None):
        raise fail("give one of --mqtt URL (the lab's broker) or --daemon URL (its API)")
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
            raise fail(f"backend {backend!r}: expected auto, nvml, nvidia-smi or emulated")
        bus = _bus(mqtt, mqtt_credentials, instance, host) if mqtt is not None else None
        token = _token(token_file) if daemon else None
        # What no log line may show, debug lines of the HTTP and MQTT clients included.
        add_secrets(token, *_bus_secrets(bus))
        runner = Agent(lab=lab, host=host, backend=chosen, mqtt=bus, daemon=daemon,
                       token=token, interval=interval, expected_gpus=gpus, jobs=commands,
                       nics=SysfsNics(interfaces) if interfaces else None)
        server = _metrics(runner, metrics_host, metrics_port)
    except LabdError as exc:
        raise fail(str(exc)) from None
    if mqtt is not None and not mqtt_credentials:
        console.print("[yellow]warning:[/] no --mqtt-credentials: the daemon takes only "
                      "signed messages from hosts (labd broker-config LAB writes them)")
    console.print(f"labd agent: host {host} of lab {lab}, reporting to {mqtt or daemon} every "
                  f"{interval:g} s ({backend}); jobs: {', '.join(commands) or 'none'}; "
                  f"NICs: {', '.join(interfaces) or 'none'}")
    if server is not None:
        shown = f"[{server.host}]" if ":" in server.host else server.host
        console.print(f"  metrics: {escape(f'http://{shown}:{server.port}/metrics')}")
    try:
        _serve(runner)
    finally:
        if server is not None:
            server.close()


def main() -> None:
    """``python -m labd.agent``: the agent command alone, logging warnings and errors as
    ``labd agent`` does without ``-v`` (or as its --log-* options say)."""
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    app.command()(agent)
    app()


def _serve(runner: Agent) -> None:
    """Run the agent until SIGINT or SIGTERM; a start-up failure is one clear message."""
    from labd.agent.reporter import run_agent

    # spawns: the standard loop, not uvloop: the agent starts job processes while it talks
    # MQTT (labd/runtime.py says why that needs it).
    run_until_signalled("the agent", partial(run_agent, runner), spawns=True)


def _metrics(runner: Agent, host: str, port: int | None) -> MetricsServer | None:
    """The agent's /metrics where --metrics-port asks for it; prometheus-client is loaded
    only then."""
    if port is None:
        return None
    from labd.agent.metrics import MetricsServer

    return MetricsServer(runner, host, port)


def _bus_secrets(bus: BusSettings | None) -> list[str | None]:
    if bus is None:
        return []
    creds = bus.credentials
    return [creds.password, *(key.hex() for key in creds.hosts.values())]


def _assignments(values: list[str] | None, option: str, what: str) -> dict[str, str]:
    """``NAME=VALUE`` options, each name once."""
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, rest = value.partition("=")
        if not sep or not name.strip() or not rest.strip():
            raise fail(f"{option} {value!r}: expected {what}")
        if name.strip() in out:
            raise fail(f"{option}: {name.strip()!r} is given twice")
        out[name.strip()] = rest.strip()
    return out


def _bus(url: str, credentials: str | None, instance: str | None, host: str) -> BusSettings:
    """The broker as this host uses it: its own key only, whatever the file holds."""
    from labd.mqtt.credentials import BusSettings

    settings = BusSettings.load(url, credentials, instance)
    if credentials and host not in settings.credentials.hosts:
        raise fail(f"{credentials} holds no key for host {host} (labd broker-config writes "
                   f"one per host: hosts/{host}.toml)")
    return settings.for_host(host)


def _token(file: str | None) -> str:
    """--token-file, else $LABD_TOKEN, else the token file; the agent never makes one."""
    from labd.token import find_token, token_path

    found = find_token(file=file)
    if found is None:
        raise fail(f"--daemon needs the daemon's token: set $LABD_TOKEN, give --token-file, "
                   f"or copy the daemon's token file to {token_path()}")
    return found

