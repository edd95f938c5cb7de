"""`labd run` as a systemd service: READY=1 once it serves, WATCHDOG=1 at half the
watchdog period, and SIGTERM answered within 2 s, a reconfiguration under way finished and
recorded, even with a client that never finishes its request and one that never reads."""

import asyncio
import os
import socket
import sqlite3
from pathlib import Path

import httpx
import pytest

from labd import deadlines
from labd.settings import ENV_PREFIX, NAMES, daemon_table, env_name, resolve
from labd.systemd import Notifier
from tests.commands.running import Running
from tests.labs import switch, write_lab

TOKEN = "service-token"
#: The stop systemd is promised (a deadline on the wait, not a measurement).
STOP_S = 2.0


class NotifySocket:
    """The socket systemd would listen on: each datagram a message."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.bind(str(path))
        self.socket.setblocking(False)
        self.messages: list[set[str]] = []

    async def wait_for(self, field: str, timeout: float) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout):
            while not any(field in message for message in self.messages):
                data = await loop.sock_recv(self.socket, 4096)
                self.messages.append(set(data.decode().splitlines()))

    def drain(self) -> None:
        try:
            while True:
                self.messages.append(set(self.socket.recv(4096).decode().splitlines()))
        except BlockingIOError:
            pass

    def close(self) -> None:
        self.socket.close()


def test_the_notifier_follows_systemd_environment(tmp_path: Path) -> None:
    assert not Notifier.from_env({}).enabled  # no socket: silently nothing
    assert not Notifier.from_env({}).send("READY=1")
    listener = NotifySocket(tmp_path / "n.sock")
    try:
        other = Notifier.from_env({"NOTIFY_SOCKET": str(listener.path),
                                   "WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"})
        assert other.enabled and other.watchdog_s is None  # the watchdog is another's
        ours = Notifier.from_env({"NOTIFY_SOCKET": str(listener.path),
                                  "WATCHDOG_USEC": "2000000",
                                  "WATCHDOG_PID": str(os.getpid())})
        assert ours.watchdog_s == 2.0
        assert ours.ready("up")
        listener.drain()
        assert listener.messages == [{"READY=1", "STATUS=up"}]
        ours.close()
        other.close()
    finally:
        listener.close()


async def test_sigterm_ends_labd_run_in_time_with_the_change_under_way_recorded(
        tmp_path: Path) -> None:
    # A switch slow enough that the signal comes while it moves; no liveness queries, so
    # that the only command after the request is the request's.
    _, lab = write_lab(tmp_path, "svc", "light_window_ms = 1000\n",  # in [lab]: over 400
                       switch(size="8x8", switch_ms=400, watch_interval_s=0))
    notify = NotifySocket(tmp_path / "notify.sock")
    db = tmp_path / "s.sqlite"
    daemon = await Running.start(
        str(lab), "--db", str(db), "--port", "0", "--log-format", "json",
        "--log-level", "info,instruments.wire=debug",
        env={"LABD_TOKEN": TOKEN, "NOTIFY_SOCKET": str(notify.path),
             "WATCHDOG_USEC": "300000"})
    stuck: list[socket.socket] = []
    try:
        await notify.wait_for("READY=1", deadlines.current().of("process_ready"))
        await notify.wait_for("WATCHDOG=1", deadlines.current().times(10))
        url = await daemon.url()
        host, port = url.removeprefix("http://").split(":")
        # A client that sent half a request and went quiet, and one on the event stream
        # that reads nothing: neither may hold the stop.
        half = socket.create_connection((host, int(port)))
        half.sendall(b"POST /v1/switches/ocs1/connections HTTP/1.1\r\nHost: x\r\n"
                     b"Authorization: Bearer " + TOKEN.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"pa")
        deaf = socket.create_connection((host, int(port)))
        deaf.sendall(b"GET /v1/events HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\n"
                     b"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n")
        stuck += [half, deaf]
        async with httpx.AsyncClient(base_url=url, headers={
                "Authorization": f"Bearer {TOKEN}"}, timeout=STOP_S * 5) as http:
            seen = len(daemon.logs)
            change = asyncio.create_task(
                http.post("/v1/switches/ocs1/connections", json={"pairs": [[2, 10]]}))
            # The command is on the wire (the switch now takes 400 ms): stop the daemon.
            await daemon.log("the command on the wire", lambda line: line["logger"] ==
                             "instruments.wire" and ">>" in line["message"], after=seen)
            code = await daemon.stop(timeout=STOP_S)
            answer = await change
        assert code == 0
        assert answer.status_code == 200 and answer.json()["outcome"] == "ok", answer.text
        notify.drain()
        assert any("STOPPING=1" in message for message in notify.messages)
    finally:
        for sock in stuck:
            sock.close()
        notify.close()
        await daemon.close()
    with sqlite3.connect(db) as store:
        rows = store.execute("select id, outcome from reconfigurations").fetchall()
        intended = store.execute("select a, b from intended_pairs").fetchall()
    assert rows == [(answer.json()["id"], "ok")]
    assert intended == [(2, 10)]


DEPLOY = Path(__file__).parents[2] / "deploy"


def test_the_deploy_files_name_only_settings_that_exist() -> None:
    yaml = pytest.importorskip("yaml")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    assert {"labd", "mosquitto", "postgres"} <= set(compose["services"])
    environment = compose["services"]["labd"]["environment"]
    settings = {k: v for k, v in environment.items() if k.startswith(ENV_PREFIX)}
    assert {"LABD_DB", "LABD_MQTT", "LABD_TOKEN_FILE"} <= set(settings)
    resolved = resolve(env=settings)  # each one a setting, each value usable
    assert all(resolved.source(n) == "env" for n in NAMES if env_name(n) in settings)
    example = daemon_table(DEPLOY / "labd.toml", required=True)
    assert example and resolve(files=[("labd.toml", example)]).settings.log_format == "json"
    unit = (DEPLOY / "systemd" / "labd.service").read_text()
    assert "Type=notify" in unit and "WatchdogSec=" in unit
    assert "%i" in (DEPLOY / "systemd" / "labd-agent@.service").read_text()
