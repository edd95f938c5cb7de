"""``labd run``: the daemon, owning every instrument of a lab and serving the API; the
instruments marked for emulation are emulated in the same process."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Annotated

import typer

from labd.commands.common import console, fail, load, run_until_signalled


def run_daemon(
    lab: Annotated[str, typer.Argument(help="Lab file path, or a packaged lab name.")],
    db: Annotated[str, typer.Option(help="Store: a SQLite file path, or a PostgreSQL URL.")]
    = "labd.sqlite",
    host: Annotated[str, typer.Option(help="Address the API listens on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="API port.")] = 8470,
    token_file: Annotated[Path | None, typer.Option(
        help="File holding the daemon's token, its admin key (default: $LABD_TOKEN, else "
             "the token file in the user's state folder, made 0600 on first run).")] = None,
    access: Annotated[Path | None, typer.Option(
        help="Access file: the API's keys (tokens or their SHA-256) and each one's role, "
             "viewer, operator or admin (docs/daemon.md).")] = None,
    open_reads: Annotated[bool, typer.Option(
        help="Let anyone read the API and the event stream without a key (changes still "
             "need one).")] = False,
    max_body: Annotated[int, typer.Option(
        min=0, max=1 << 30, help="The largest request body the API reads, in bytes.")]
    = 1 << 20,
    tls_cert: Annotated[Path | None, typer.Option(
        help="Serve the API over HTTPS with this certificate (PEM; with --tls-key).")] = None,
    tls_key: Annotated[Path | None, typer.Option(
        help="The certificate's private key (PEM).")] = None,
    restore: Annotated[bool, typer.Option(
        help="When a switch holds other circuits than intended (at start-up, or back "
             "online after a reconnect or a restart), do what its on_drift says in the lab "
             "file (restore by default); --no-restore only reports the drift, on every "
             "switch.")] = True,
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
) -> None:
    """The daemon: owns every instrument of the lab, serves the API on HOST:PORT. Instruments
    marked `emulate = true` are emulated in this process."""
    from labd.daemon.access import Access, ApiSettings, beyond_loopback
    from labd.emulation.rig import emulated_rig
    from labd.errors import LabdError
    from labd.files import readable_by_others
    from labd.mqtt.credentials import BusSettings
    from labd.token import read_token_file, token_path

    loaded = load(lab)
    try:
        bus = BusSettings.load(mqtt, mqtt_credentials, instance) if mqtt else None
        token = read_token_file(token_file) if token_file else None
        api = ApiSettings(access=Access.load(access) if access else None,
                          open_reads=open_reads, max_body=max_body,
                          tls_cert=str(tls_cert) if tls_cert else None,
                          tls_key=str(tls_key) if tls_key else None)
    except LabdError as exc:
        raise fail(str(exc)) from None
    warnings = [f"{path} can be read by other users: chmod 600 {path}"
                for path in (token_file, access) if path is not None and readable_by_others(path)]
    if beyond_loopback(host) and not api.tls:
        warnings.append(f"the API listens on {host} without TLS: its keys and every answer "
                        "cross the network in clear; give --tls-cert and --tls-key")
    played = {h.id for h in loaded.host if h.emulate}
    unkeyed = [h.id for h in loaded.host if h.id not in played and (
        bus is None or h.id not in bus.credentials.hosts)]

    async def serve(stop: asyncio.Event) -> None:
        async with emulated_rig(loaded, db=db, mqtt=bus, host=host, port=port, token=token,
                                api=api, restore=restore, tidy=False) as rig:
            daemon, report, hosts = rig.daemon, rig.report, rig.hosts
            console.print(f"[bold]labd run[/]: lab [cyan]{loaded.lab.name}[/], "
                          f"API {daemon.url}/v1 (OpenAPI at {daemon.url}/docs), store {db}")
            for name, what in report.connected.items():
                emulated_note = " (emulated)" if name in rig.addresses else ""
                console.print(f"  [green]ok[/]      {name:10} {what}{emulated_note}")
            for name, why in report.failed.items():
                console.print(f"  [red]failed[/]  {name:10} {why} (retrying)")
            for name, drift in report.drift.items():
                action = ("restored" if name in report.restored else
                          "adopted" if name in report.adopted else "reported")
                console.print(f"  [yellow]drift[/]   {name:10} {len(drift.missing)} "
                              f"missing, {len(drift.unexpected)} unexpected ({action})")
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
            if bus is not None and unkeyed:
                console.print(f"  [yellow]warning[/]: no MQTT key for host(s) "
                              f"{', '.join(unkeyed)}: their messages will be refused; give "
                              "--mqtt-credentials (labd broker-config LAB writes them)")
            if hosts:
                console.print(f"  {len(hosts)} emulated GPU host(s) report to "
                              f"{mqtt or daemon.url + ' (HTTP)'}; failover drills: "
                              "POST /v1/drills/failover (labd tui: d)")
            if rig.addresses or hosts:
                console.print(f"  emulators' control endpoint: {rig.control_url}")
            await stop.wait()

    # Emulated hosts start their jobs' processes.
    run_until_signalled("the daemon", serve, spawns=any(h.emulate for h in loaded.host))
