"""``labd run``: the daemon, owning every instrument of a lab and serving the API.

Its settings come from the defaults, the lab file's ``[daemon]`` table, ``--config FILE``,
``LABD_*`` and these options, each over the one before (labd.settings), and the daemon is
built from them by labd.daemon.assembly. Only a lab with ``emulate = true`` entries loads
the emulators, in the same process (labd.emulation.rig). Under systemd it says when it is
ready and pets the watchdog (labd.systemd)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from labd.commands.common import console, fail, load, run_until_signalled

if TYPE_CHECKING:
    from labd.daemon.assembly import Assembly
    from labd.daemon.core import Daemon
    from labd.emulation.emulators import EmulatedHost
    from labd.fabric.drift import StartupReport
    from labd.lab.loader import Lab
    from labd.mqtt.credentials import BusSettings
    from labd.settings import Resolved

log = logging.getLogger("labd.run")

CONFIG_HELP = ("A settings file (TOML, its settings under \\[daemon]): over the lab file's "
               "own \\[daemon] table, under LABD_* variables and these options.")


def run_daemon(
    ctx: typer.Context,
    lab: Annotated[str, typer.Argument(help="Lab file path, or a packaged lab name.")],
    config: Annotated[Path | None, typer.Option(help=CONFIG_HELP)] = None,
    db: Annotated[str | None, typer.Option(
        help="Store: a SQLite file path, or a PostgreSQL URL [default: labd.sqlite].")] = None,
    host: Annotated[str | None, typer.Option(
        help="Address the API listens on [default: 127.0.0.1].")] = None,
    port: Annotated[int | None, typer.Option(
        min=0, max=65535, help="API port [default: 8470].")] = None,
    token_file: Annotated[Path | None, typer.Option(
        help="File holding the daemon's token, its admin key (default: $LABD_TOKEN, else "
             "the token file in the user's state folder, made 0600 on first run).")] = None,
    access: Annotated[Path | None, typer.Option(
        help="Access file: the API's keys (tokens or their SHA-256) and each one's role, "
             "viewer, operator or admin (docs/daemon.md).")] = None,
    open_reads: Annotated[bool | None, typer.Option(
        "--open-reads/--no-open-reads",
        help="Let anyone read the API and the event stream without a key (changes still "
             "need one).")] = None,
    metrics_need_key: Annotated[bool | None, typer.Option(
        "--metrics-need-key/--no-metrics-need-key",
        help="Serve GET /metrics only to a viewer's key or better, as every other read "
             "(default: without a key, as Prometheus scrapes).")] = None,
    max_body: Annotated[int | None, typer.Option(
        min=0, max=1 << 30, help="The largest request body the API reads, in bytes "
                                 "[default: 1048576].")] = None,
    tls_cert: Annotated[Path | None, typer.Option(
        help="Serve the API over HTTPS with this certificate (PEM; with --tls-key).")] = None,
    tls_key: Annotated[Path | None, typer.Option(
        help="The certificate's private key (PEM).")] = None,
    restore: Annotated[bool | None, typer.Option(
        "--restore/--no-restore",
        help="When a switch holds other circuits than intended (at start-up, or back "
             "online after a reconnect or a restart), do what its on_drift says in the lab "
             "file (restore by default); --no-restore only reports the drift, on every "
             "switch.")] = None,
    mqtt: Annotated[str | None, typer.Option(
        help="MQTT broker, mqtt://HOST[:PORT] (mqtts:// for TLS); events and commands "
             "go through it.")] = None,
    mqtt_credentials: Annotated[str | None, typer.Option(
        help="The daemon's MQTT credentials (labd broker-config writes daemon.toml): its "
             "broker login and the keys of the hosts and clients whose signed messages it "
             "takes.")] = None,
    instance: Annotated[str | None, typer.Option(
        help="Lab instance: topics under labd/LAB@INSTANCE, so that two runs of one lab "
             "share a broker without hearing each other (default: the credentials file's, "
             "else none: labd/LAB).")] = None,
    watch_interval_s: Annotated[float | None, typer.Option(
        "--watch-interval", min=0, max=3600,
        help="Seconds idle before each instrument gets one cheap query, for those whose "
             "lab entry sets no watch_interval_s (0 turns the watch off).")] = None,
    log_level: Annotated[str | None, typer.Option(
        help="Log levels: one for every logger, then NAME=LEVEL for some, e.g. "
             "info,labd.fabric=debug,instruments.wire=debug (raw bytes) [default: warning; "
             "labd -v: info, -vv: debug].")] = None,
    log_format: Annotated[str | None, typer.Option(
        help="human (on a terminal: rich; elsewhere one plain line each) or json (one "
             "object per line, for collectors) [default: human].")] = None,
    log_file: Annotated[Path | None, typer.Option(
        help="Write the logs to this file instead of stderr, rotated at "
             "log_file_max_bytes with log_file_backups kept (settings).")] = None,
    ha_url: Annotated[str | None, typer.Option(
        "--ha", help="Run as one of several daemons of the lab, on this PostgreSQL "
                     "(postgresql://…, also the store): the one holding its lease leads, "
                     "the others stand by, answer reads and take over when it goes "
                     "(docs/scale.md).")] = None,
    lease_renew_s: Annotated[float | None, typer.Option(
        "--lease-renew", min=0.01, max=60,
        help="Seconds between the leader's renewals of its lease [default: 0.5].")] = None,
    lease_ttl_s: Annotated[float | None, typer.Option(
        "--lease-ttl", min=0.02, max=600,
        help="Seconds a lease holds without renewal; a standby takes over within about "
             "this once the leader is gone [default: 2].")] = None,
    cpu: Annotated[str | None, typer.Option(
        "--cpu", metavar="N|auto",
        help="Hold the event loop, and the store's writer with it, on this one CPU "
             "(Linux; auto: the one the loop starts on): a few per cent more "
             "reconfigurations a second where the daemon has the CPU to itself "
             "(docs/service.md) [default: wherever the kernel puts it].")] = None,
) -> None:
    """The daemon: owns every instrument of the lab, serves the API on HOST:PORT. Instruments
    marked `emulate = true` are emulated in this process.

    Settings come from the defaults, the lab file's \\[daemon] table, --config FILE, LABD_*
    environment variables and these options, each over the one before; `labd config show`
    prints them with the source of each. Under systemd (Type=notify) it says when it is
    ready and pets the watchdog; SIGTERM or SIGINT stops it within 2 s, reconfigurations
    under way finished and recorded."""
    from labd.settings import SettingsError

    flags: dict[str, Any] = {
        "db": db, "host": host, "port": port, "token_file": _text(token_file),
        "access": _text(access), "open_reads": open_reads,
        "metrics_need_key": metrics_need_key, "max_body": max_body,
        "tls_cert": _text(tls_cert), "tls_key": _text(tls_key), "restore": restore,
        "mqtt": mqtt, "mqtt_credentials": mqtt_credentials, "instance": instance,
        "watch_interval_s": watch_interval_s, "log_level": log_level,
        "log_format": log_format, "log_file": _text(log_file), "ha_url": ha_url,
        "lease_renew_s": lease_renew_s, "lease_ttl_s": lease_ttl_s, "cpu": cpu}
    try:
        resolved = effective_settings(lab, config, flags)
    except SettingsError as exc:
        raise fail(str(exc)) from None
    verbose = int((ctx.find_root().obj or {}).get("verbose", 0))
    _start_logs(resolved, verbose)
    serve_lab(load(lab), resolved)


def _text(path: Path | None) -> str | None:
    return None if path is None else str(path)


def effective_settings(lab: str | None, config: Path | None,
                       flags: dict[str, Any] | None = None) -> Resolved:
    """The settings ``labd run LAB --config FILE FLAGS`` runs with (SettingsError, or the
    lab's own problem as one message)."""
    from labd.errors import LabFileError
    from labd.settings import daemon_table, layered

    table: tuple[str, dict[str, Any]] | None = None
    if lab is not None:
        from labd.lab.loader import resolve_lab_path

        try:
            path = resolve_lab_path(lab)
        except LabFileError as exc:
            raise fail("the lab file has problems:\n  " + "\n  ".join(exc.problems)) from None
        found = daemon_table(path, label=lab)
        table = None if found is None else (lab, found)
    return layered(table, config=config, flags=flags)


def _start_logs(resolved: Resolved, verbose: int) -> None:
    from labd.commands.common import err_console
    from labd.logs import LogSettingsError, configure, json_consoles, level_for

    settings = resolved.settings
    # -v counts where no source named a level: the one-off run at a terminal.
    spec = (settings.log_level if resolved.source("log_level") != "default"
            else level_for(verbose, None))
    try:
        configure(spec, settings.log_format, settings.log_file,
                  max_bytes=settings.log_file_max_bytes, backups=settings.log_file_backups,
                  secrets=[os.environ.get("LABD_TOKEN")])
    except LogSettingsError as exc:
        raise fail(f"setting log_file (from {resolved.where['log_file']}): {exc}") from None
    if settings.log_format == "json":  # the start-up report and any error: JSON lines too
        json_consoles(console, err_console, "labd.run")


def _lab_secrets(lab: Lab, bus: BusSettings | None) -> list[str | None]:
    """What no log line may show: TL1 passwords, the broker login, the bus's keys."""
    out: list[str | None] = []
    for entry in lab.instrument:
        resolved_password = getattr(entry, "resolved_password", None)
        if resolved_password is not None:
            with contextlib.suppress(ValueError):  # the driver says so when it logs in
                out.append(resolved_password())
    if bus is not None:
        creds = bus.credentials
        out.append(creds.password)
        out += [key.hex() for key in (*creds.hosts.values(), *creds.clients.values())]
    return out


@dataclass
class Serving:
    """The daemon ``labd run`` serves, and what the emulated rig adds where it runs one."""

    daemon: Daemon
    hosts: list[EmulatedHost] = field(default_factory=list)
    """The GPU hosts emulated in this process."""
    addresses: dict[str, str] = field(default_factory=dict)
    """Where each emulated instrument listens."""
    control_url: str | None = None
    """The emulators' control endpoint; None where nothing is emulated."""


@contextlib.asynccontextmanager
async def serving(built: Assembly) -> AsyncIterator[Serving]:
    """The daemon ``built`` on its instruments; the emulated rig around it only where an
    entry says ``emulate = true``, so that a real lab loads no emulator."""
    if not built.emulates:
        async with built.daemon() as daemon:
            yield Serving(daemon)
        return
    from labd.emulation.rig import rig_on

    async with rig_on(built, tidy=False) as rig:
        yield Serving(rig.daemon, hosts=rig.hosts, addresses=rig.addresses,
                      control_url=rig.control_url)


def serve_lab(loaded: Lab, resolved: Resolved) -> None:
    """Run the daemon on ``loaded`` with ``resolved`` settings until SIGINT or SIGTERM."""
    from labd.daemon.access import beyond_loopback
    from labd.daemon.assembly import from_settings
    from labd.errors import LabdError
    from labd.files import readable_by_others
    from labd.logs import add_secrets
    from labd.mqtt.credentials import BusSettings
    from labd.systemd import Notifier
    from labd.token import token_path

    settings = resolved.settings
    token_file = Path(settings.token_file) if settings.token_file else None
    access = Path(settings.access) if settings.access else None
    try:
        built = from_settings(loaded, resolved)
    except LabdError as exc:
        raise fail(str(exc)) from None
    loaded, db, host, mqtt, api = built.lab, built.db, built.host, settings.mqtt, built.api
    bus = BusSettings.of(built.bus) if built.bus is not None else None
    token = built.token
    add_secrets(token, *_lab_secrets(loaded, bus))
    warnings = [f"{path} can be read by other users: chmod 600 {path}"
                for path in (token_file, access) if path is not None and readable_by_others(path)]
    if beyond_loopback(host) and not api.tls:
        warnings.append(f"the API listens on {host} without TLS: its keys and every answer "
                        "cross the network in clear; give --tls-cert and --tls-key")
    played = {h.id for h in loaded.host if h.emulate}
    unkeyed = [h.id for h in loaded.host if h.id not in played and (
        bus is None or h.id not in bus.credentials.hosts)]
    notifier = Notifier.from_env()

    async def serve(stop: asyncio.Event) -> None:
        async with serving(built) as rig:
            daemon, hosts = rig.daemon, rig.hosts
            add_secrets(daemon.token)  # made or found at start-up where none was given
            console.print(f"[bold]labd run[/]: lab [cyan]{loaded.lab.name}[/], "
                          f"API {daemon.url}/v1 (OpenAPI at {daemon.url}/docs), "
                          f"store {daemon.store.where}")
            if daemon.role is not None:
                console.print(f"  {_role_line(daemon)}")
                log.warning("lab %s: %s", loaded.lab.name, _role_line(daemon))
            log.info("lab %s: API %s/v1, store %s", loaded.lab.name, daemon.url, db)
            _tell_instruments(daemon.report, set(rig.addresses))
            if token_file is not None:
                where = f"admin: {token_file}"
            elif access is not None:
                where = "no token file: the access file's keys only"
            else:
                where = "admin: " + ("$LABD_TOKEN" if os.environ.get("LABD_TOKEN")
                                     else str(token_path()))
            reads = "changes" if api.reads_open() else "reads and changes"
            keys = f", keys: {access}" if access is not None else ""
            console.print(f"  {reads} need 'Authorization: Bearer <token>' ({where}{keys})")
            for warning in warnings:
                console.print(f"  [yellow]warning[/]: {warning}")
                log.warning("%s", warning)
            if bus is not None and unkeyed:
                console.print(f"  [yellow]warning[/]: no MQTT key for host(s) "
                              f"{', '.join(unkeyed)}: their messages will be refused; give "
                              "--mqtt-credentials (labd broker-config LAB writes them)")
            _tell_hosts(loaded, played, set(unkeyed) if bus is not None else set(),
                        mqtt or daemon.url)
            if hosts:
                console.print(f"  {len(hosts)} emulated GPU host(s) report to "
                              f"{mqtt or daemon.url + ' (HTTP)'}; failover drills: "
                              "POST /v1/drills/failover (labd tui: d)")
            if rig.control_url is not None and (rig.addresses or hosts):
                console.print(f"  emulators' control endpoint: {rig.control_url}")
            notifier.ready(f"serving lab {loaded.lab.name} on {daemon.url}")
            petting = asyncio.create_task(notifier.keep_alive(stop), name="labd-watchdog")
            try:
                await stop.wait()
            finally:
                notifier.stopping()
                await petting
            log.info("lab %s: stopping", loaded.lab.name)

    # Emulated hosts start their jobs' processes.
    try:
        run_until_signalled("the daemon", serve, spawns=any(h.emulate for h in loaded.host))
    finally:
        notifier.close()


def _tell_instruments(report: StartupReport, emulated: set[str]) -> None:
    """The start-up report, on the console and in the log: each instrument connected or
    failed, and each switch's drift with what was done about it."""
    for name, what in report.connected.items():
        emulated_note = " (emulated)" if name in emulated else ""
        console.print(f"  [green]ok[/]      {name:10} {what}{emulated_note}")
        log.info("%s connected: %s%s", name, what, emulated_note, extra={"instrument": name})
    for name, why in report.failed.items():
        console.print(f"  [red]failed[/]  {name:10} {why} (retrying)")
        log.warning("%s failed to connect: %s (retrying)", name, why,
                    extra={"instrument": name})
    for name, drift in report.drift.items():
        action = ("restored" if name in report.restored else
                  "adopted" if name in report.adopted else "reported")
        console.print(f"  [yellow]drift[/]   {name:10} {len(drift.missing)} "
                      f"missing, {len(drift.unexpected)} unexpected ({action})")
        log.warning("%s drifted: %d missing, %d unexpected (%s)", name,
                    len(drift.missing), len(drift.unexpected), action,
                    extra={"instrument": name})


def _tell_hosts(lab: Lab, played: set[str], unkeyed: set[str], reports_to: str) -> None:
    """In the log, where each GPU host's reports come from."""
    for entry in lab.host:
        if entry.id in played:
            log.info("host %s: emulated in this process", entry.id, extra={"host": entry.id})
        elif entry.id in unkeyed:
            log.warning("host %s: no MQTT key, its messages will be refused", entry.id,
                        extra={"host": entry.id})
        else:
            log.info("host %s: its agent reports to %s", entry.id, reports_to,
                     extra={"host": entry.id})


def _role_line(daemon: Daemon) -> str:
    """Under --ha: whether this daemon leads, and if not, who does."""
    assert daemon.role is not None
    about = daemon.role.describe()
    if about["role"] == "leader":
        return (f"leads (epoch {about['epoch']}); standbys take over within "
                f"{about['lease_ttl_s']:g} s of its end")
    return (f"stands by: reads answered here, changes refused (503) while "
            f"{about['leader'] or 'nobody'} leads; takes over when the lease is free")
