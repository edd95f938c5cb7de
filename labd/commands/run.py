"""``labd run``: the daemon, owning every instrument of a lab and serving the API; the
instruments marked for emulation are emulated in the same process."""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import typer

from labd.commands.common import console, fail, load, run_until_signalled


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
    from labd.emulation.rig import emulated_rig
    from labd.errors import LabdError
    from labd.mqtt.credentials import BusSettings
    from labd.token import token_path

    loaded = load(lab)
    try:
        bus = BusSettings.load(mqtt, mqtt_credentials, instance) if mqtt else None
    except LabdError as exc:
        raise fail(str(exc)) from None
    played = {h.id for h in loaded.host if h.emulate}
    unkeyed = [h.id for h in loaded.host if h.id not in played and (
        bus is None or h.id not in bus.credentials.hosts)]

    async def serve(stop: asyncio.Event) -> None:
        async with emulated_rig(loaded, db=db, mqtt=bus, host=host, port=port, token=token,
                                restore=restore, tidy=False) as rig:
            daemon, report, hosts = rig.daemon, rig.report, rig.hosts
            console.print(f"[bold]labd run[/]: lab [cyan]{loaded.lab.name}[/], "
                          f"API {daemon.url}/v1 (OpenAPI at {daemon.url}/docs), store {db}")
            for name, what in report.connected.items():
                emulated_note = " (emulated)" if name in rig.addresses else ""
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
