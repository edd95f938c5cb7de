"""The tests' own brokers (labd.mqtt.private through tests.broker): started on a port of
their own, stopped by SIGTERM or SIGKILL, started again on the same port, where a client
that lost its connection connects again; a config of the test's (a password file,
persistence) taken; a port held by another process refused with a clear error."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import aiomqtt
import pytest

from labd.mqtt.mosquitto import password_line
from tests.broker import MQTT, Mosquitto, MosquittoError, next_message, require_broker


async def test_killed_and_started_again_on_the_same_port_a_client_reconnects(
        tmp_path: Path) -> None:
    async with Mosquitto(tmp_path) as broker:
        port = broker.port
        assert broker.url == f"mqtt://127.0.0.1:{port}"
        client = aiomqtt.Client(*broker.address, identifier="keeps-coming-back")
        killed = False
        try:
            async with client:
                await client.subscribe("t/#")
                await client.publish("t/1", b"before", qos=1)
                assert (await next_message(client.messages, "t/1")).payload == b"before"
                # The subscriber is still connected (the broker's side of it will be left
                # in TIME_WAIT), as a crash finds it.
                assert await broker.stop(signal.SIGKILL) == -signal.SIGKILL
                killed = True
                with pytest.raises(aiomqtt.MqttError):
                    await next_message(client.messages, "t/#")
        except aiomqtt.MqttError:
            if not killed:
                raise
            # aiomqtt before 2.5 raises the lost connection's error again as it leaves.
        assert not broker.running

        await broker.start()
        assert broker.port == port
        async with client:  # the same client, connecting again
            await client.subscribe("t/#")
            await client.publish("t/2", b"after", qos=1)
            assert (await next_message(client.messages, "t/2")).payload == b"after"

        assert await broker.stop(signal.SIGTERM) == 0
        await broker.start()
        async with aiomqtt.Client(*broker.address) as again:
            await again.publish("t/3", b"x")
    log = broker.log.read_text()
    assert log.count(f"Opening ipv4 listen socket on port {port}") == 3, log
    assert "keeps-coming-back" in log  # the broker's log is kept, across restarts


async def test_retained_messages_survive_a_restart_with_persistence(tmp_path: Path) -> None:
    async with Mosquitto(tmp_path, config=["persistence true"]) as broker:
        async with aiomqtt.Client(*broker.address) as client:
            await client.publish("kept", b"retained", qos=1, retain=True)
        await broker.stop(signal.SIGTERM)  # Mosquitto saves its store as it stops
        await broker.start()
        async with aiomqtt.Client(*broker.address) as client:
            await client.subscribe("kept")
            assert (await next_message(client.messages, "kept")).payload == b"retained"
    # In the broker's folder, not the working directory.
    assert f"Saving in-memory database to {broker.folder}/" in broker.log_tail(100)


async def test_a_password_file_in_the_config_keeps_anonymous_clients_out(
        tmp_path: Path) -> None:
    passwd = tmp_path / "passwd"
    passwd.write_text(password_line("lab", "secret") + "\n")
    passwd.chmod(0o600)
    async with Mosquitto(tmp_path, config=[f"password_file {passwd}"]) as broker:
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client(*broker.address):
                pass
        async with aiomqtt.Client(*broker.address, username="lab", password="secret"):
            pass


async def test_a_port_held_by_another_process_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        broker = Mosquitto(tmp_path, port=holder.getsockname()[1])
        with pytest.raises(MosquittoError, match="held by another process"):
            await broker.start()
    assert not broker.running


def test_the_shared_broker_is_the_sessions_own() -> None:
    shared = require_broker()
    assert shared.url == MQTT and shared.port != 1883 and shared.running
    with socket.create_connection(shared.address, timeout=5):
        pass
