"""``/healthz`` and ``/readyz``: answered without a key (and with one), saying nothing but
their status; neither fails for an instrument or the broker that is down; readiness is 503
while the daemon stops, and 200 on a standby (``--ha``)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import httpx

from labd import deadlines
from labd.daemon.core import Daemon
from labd.emulation.emulators import emulated_lab, endpoint_of
from labd.ha.role import HaSettings
from labd.lab.loader import load_lab
from labd.mqtt.private import Mosquitto
from tests.databases import postgres_database
from tests.labs import switch, write_lab
from tests.rigs import AUTH, StartRig, next_event

PROBES = {"/healthz": {"status": "alive"}, "/readyz": {"status": "ready"}}


async def probe(url: str, headers: dict[str, str] | None = None) -> dict[str, tuple[int, object]]:
    async with httpx.AsyncClient(base_url=url, headers=headers) as http:
        return {path: ((r := await http.get(path)).status_code, r.json()) for path in PROBES}


def answered() -> dict[str, tuple[int, object]]:
    return {path: (200, body) for path, body in PROBES.items()}


async def test_probes_need_no_key_and_say_nothing_else(start_rig: StartRig) -> None:
    async with start_rig("probes", switch(), token="t") as rig:
        url = rig.daemon.url
        assert await probe(url) == answered()
        assert await probe(url, AUTH) == answered()
        # A key that is no key of the daemon's does not matter either.
        assert await probe(url, {"Authorization": "Bearer nope"}) == answered()
        async with httpx.AsyncClient(base_url=url) as http:
            for path in PROBES:
                head = await http.head(path)
                assert head.status_code == 200 and head.content == b""
                assert head.headers["cache-control"] == "no-store"
            # The rest of the API still needs one.
            assert (await http.get("/v1/health")).status_code == 401
            schema = (await http.get("/openapi.json")).json()
        assert not set(PROBES) & set(schema["paths"])


async def test_an_instrument_down_fails_neither_probe(start_rig: StartRig) -> None:
    async with start_rig("probes-down", switch(watch_interval_s=0.1), token="t") as rig:
        _, sub = rig.daemon.hub.subscribe()
        assert rig.emulated is not None
        await rig.emulated.power("ocs1", on=False)
        while (await next_event(sub, "instrument.state")).data["state"] != "backoff":
            pass
        assert await probe(rig.daemon.url) == answered()


class _Heard(logging.Handler):
    """Sets ``event`` when a line containing ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__(logging.WARNING)
        self.text, self.event = text, asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_the_broker_down_fails_neither_probe(start_rig: StartRig, tmp_path: Path) -> None:
    heard = _Heard("the daemon reconnects by itself")
    logging.getLogger("labd.daemon.bus").addHandler(heard)
    try:
        async with Mosquitto(tmp_path / "broker") as broker, \
                start_rig("probes-broker", switch(), mqtt=broker.url, token="t") as rig:
            await broker.stop()
            async with asyncio.timeout(deadlines.current().times(10)):
                await heard.event.wait()
            assert await probe(rig.daemon.url) == answered()
    finally:
        logging.getLogger("labd.daemon.bus").removeHandler(heard)


async def test_readiness_is_503_while_the_daemon_stops(start_rig: StartRig) -> None:
    async with start_rig("probes-stop", switch(), token="t") as rig:
        services = rig.daemon.services
        services.stopping = True  # as Daemon.stop sets it first
        try:
            answers = await probe(rig.daemon.url)
        finally:
            services.stopping = False
    assert answers == {"/healthz": (200, {"status": "alive"}),
                       "/readyz": (503, {"status": "not ready"})}


async def test_a_standby_is_ready(tmp_path: Path) -> None:
    _, path = write_lab(tmp_path, "ha", switch("ocs1", size="8x8"), name="probes-ha")
    lab = load_lab(path)
    emulated, entries = emulated_lab(lab)
    with postgres_database() as url:
        async with emulated:
            addresses = {e.id: endpoint_of(emulated, e) for e in entries}
            # A lease that outlives a loaded machine's pauses: this is no takeover test.
            ha = HaSettings(url, renew_s=0.2, ttl_s=5.0)
            first = Daemon(lab, db=url, addresses=addresses, port=0, token="t", ha=ha)
            second = Daemon(lab, db=url, addresses=addresses, port=0, token="t", ha=ha)
            async with first, second:
                assert second.role is not None and second.role.name == "standby"
                assert await probe(second.url) == answered()
                assert await probe(first.url) == answered()


async def test_labd_health_exits_0_alive_and_1_unanswered(start_rig: StartRig) -> None:
    """The command a container's HEALTHCHECK runs; off the loop, which serves the daemon."""
    from typer.testing import CliRunner

    from labd.commands.main import app

    runner = CliRunner()

    def health(*args: str) -> tuple[int, str]:
        result = runner.invoke(app, ["health", *args])
        return result.exit_code, result.output

    async with start_rig("probes-cli", switch(), token="t") as rig:
        url = rig.daemon.url
        assert await asyncio.to_thread(health, "--url", url) == (0, "")
        assert await asyncio.to_thread(health, "--url", url, "--ready") == (0, "")
        rig.daemon.services.stopping = True
        try:
            code, said = await asyncio.to_thread(health, "--url", url, "--ready")
        finally:
            rig.daemon.services.stopping = False
        assert code == 1 and "/readyz: 503" in said
    code, said = await asyncio.to_thread(health, "--url", url)
    assert code == 1 and "no answer" in said
