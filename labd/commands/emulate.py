"""``labd emulate``: emulators for a lab's `emulate = true` instruments (and agents with
emulated GPUs for its emulated hosts), announced as JSON lines for scripts to read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from labd.commands.common import fail, load, run_until_signalled
from labd.errors import LabdError


def emulate(
    lab: Annotated[str, typer.Argument(help="Lab file path, or a packaged lab name (demo).")],
    control_port: Annotated[int, typer.Option(min=0, max=65535,
                                              help="Port of the control endpoint "
                                                   "(0 picks a free one).")] = 0,
    resolved: Annotated[Path | None, typer.Option(
        help="Also write a copy of the lab file pointing at the emulators, every entry a "
             "table of its own ([[instrument]], [[fiber]], ...).")] = None,
    mqtt: Annotated[str | None, typer.Option(
        help="MQTT broker the emulated GPU hosts' agents report to, "
             "mqtt://HOST[:PORT] (mqtts:// for TLS).")]
    = None,
    mqtt_credentials: Annotated[str | None, typer.Option(
        help="Credentials with the emulated hosts' keys (labd broker-config's daemon.toml); "
             "the daemon refuses unsigned host messages.")] = None,
    instance: Annotated[str | None, typer.Option(
        help="The lab instance the daemon runs (labd run --instance).")] = None,
) -> None:
    """Start an emulator for every `emulate = true` instrument (and an agent with emulated
    GPUs for every `emulate = true` host). Prints one JSON line per emulator, then
    {"ready": true, "control": URL}; runs until SIGINT or SIGTERM."""
    from labd.emulation.emulators import (
        emulated_hosts,
        emulated_lab,
        endpoint_of,
        run_together,
        write_resolved,
    )
    from labd.mqtt.credentials import BusSettings

    loaded = load(lab)
    try:
        bus = BusSettings.load(mqtt, mqtt_credentials, instance) if mqtt else None
    except LabdError as exc:
        raise fail(str(exc)) from None

    async def serve(stop: asyncio.Event) -> None:
        emulated, entries = emulated_lab(loaded, control_port=control_port)
        hosts = emulated_hosts(loaded, bus, emulated)
        fleet = run_together(hosts)
        async with emulated:
            for entry in entries:
                line = {"id": entry.id, "driver": entry.driver,
                        "endpoint": endpoint_of(emulated, entry),
                        "interfaces": emulated.endpoints[entry.id]}
                print(json.dumps(line), flush=True)
            fleet.start()
            for host in hosts:
                print(json.dumps({"id": host.id, "driver": "agent", "endpoint": mqtt}),
                      flush=True)
            if resolved is not None:
                write_resolved(loaded, emulated, entries, resolved, [h.id for h in hosts])
            print(json.dumps({"ready": True, "control": emulated.control_url}), flush=True)
            try:
                await stop.wait()
            finally:
                await fleet.stop()

    # Emulated hosts start their jobs' processes.
    run_until_signalled("the emulators", serve,
                        spawns=bool(mqtt and any(h.emulate for h in loaded.host)))
