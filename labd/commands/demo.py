"""``labd demo``: the packaged demo lab in emulation, with the daemon on it, from the first
reconfiguration to the failover drill."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from labd.commands.common import console, fail, load
from labd.commands.measure.options import DeadlineScaleOption, use_deadlines
from labd.errors import LabdError
from labd.runtime import run


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
    db: Annotated[str | None, typer.Option(help="Store (SQLite path or PostgreSQL URL) of the "
                                                "demo lab; default a temporary file.")] = None,
    failover_db: Annotated[str | None, typer.Option(
        help="Store of the failover lab (its drills' timelines, job and reconfigurations): "
             "a lab's store holds one lab. Default: beside --db (demo.sqlite: "
             "demo-failover.sqlite); a temporary file without --db.")] = None,
    mqtt: Annotated[str | None, typer.Option(help="MQTT broker, mqtt://HOST[:PORT] "
                                                  "(mqtts:// for TLS), for the "
                                                  "daemon's events and the failover drill's "
                                                  "hosts (default: one on this machine, if "
                                                  "any).")] = None,
    port: Annotated[int, typer.Option(min=0, max=65535,
                                      help="API port with --serve.")] = 8470,
    failover: Annotated[bool, typer.Option(help="Run the failover drill (it needs an MQTT "
                                                "broker).")] = True,
    deadline_scale: DeadlineScaleOption = None,
) -> None:
    """Run the packaged demo lab in emulation with the daemon on it: reconfigure every
    switch through the daemon, print a report of every phase set against the emulators'
    ground truth, verify light, run a fault drill and a failover drill, exit 0."""
    from instruments.errors import InstrumentError
    from labd.emulation.demo import failover_drill, run_demo

    use_deadlines(deadline_scale)
    loaded = load(lab)
    if failover_db is None and db is not None:
        failover_db = beside(db)
    drill = failover_drill(console, mqtt, seed, db=failover_db)
    try:
        if failover and serve:  # before the lab is left serving
            run(drill, spawns=True)
        # Serving, it also runs the failover lab's emulated hosts, which start processes.
        code = run(run_demo(loaded, rounds=rounds, console=console, serve=serve,
                            seed=seed, light_events=light_events, db=db, mqtt=mqtt,
                            port=port, failover_db=failover_db), spawns=serve)
        if failover and not serve:
            run(drill, spawns=True)
    except KeyboardInterrupt:
        code = 0
    except OSError as exc:  # the API's port taken: one line, as labd run says it
        where = f" on port {port}" if serve else ""
        raise fail(f"cannot serve the demo{where}: {exc}") from None
    except (LabdError, InstrumentError) as exc:
        raise fail(str(exc)) from None
    finally:
        drill.close()  # not awaited when the demo stopped first
    raise typer.Exit(code)


def beside(db: str) -> str:
    """The failover lab's store next to the demo lab's: ``demo.sqlite`` →
    ``demo-failover.sqlite``. A URL names a database, not a file: refused, to be named."""
    if "://" in db:
        raise fail(f"--db {db!r} is a URL: name the failover lab's store too, with "
                   "--failover-db (a lab's store holds one lab), or --no-failover")
    path = Path(db)
    return str(path.with_name(f"{path.stem}-failover{path.suffix or '.sqlite'}"))
