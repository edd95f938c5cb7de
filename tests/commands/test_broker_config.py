"""``labd broker-config`` on a real Mosquitto started with the files it writes: anonymous
clients are refused, the daemon and a host's agent log in, and a host cannot publish under
another host's topics (the broker drops it before the daemon could hear it)."""

import asyncio
import contextlib
import getpass
import os
import shutil
import socket
import stat
import subprocess
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiomqtt
import pytest

from labd.agent.backends import EmulatedBackend
from labd.agent.reporter import Agent
from labd.mqtt.credentials import BusSettings, read_credentials
from labd.mqtt.envelope import Sealer
from labd.mqtt.topics import lab_root
from tests.broker import next_message
from tests.commands.test_cli import run
from tests.labs import endpoint, host, unique_name, write_lab
from tests.rigs import StartRig, next_event


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def as_this_user(conf: Path) -> tuple[str, Path]:
    """The mosquitto binary, and ``conf`` for it to run as the test's user: started as root,
    Mosquitto becomes the user 'mosquitto', who could not read the files (0600, ours)."""
    binary = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not os.path.exists(binary):
        pytest.fail("this test needs the mosquitto binary (Debian: mosquitto); .ci/run has it")
    mine = conf.with_name("test.conf")
    mine.write_text(conf.read_text() + f"user {getpass.getuser()}\n")
    return binary, mine


@contextlib.asynccontextmanager
async def mosquitto(conf: Path, port: int) -> AsyncIterator[None]:
    """A private Mosquitto on ``port`` with the config written for it."""
    binary, mine = as_this_user(conf)
    proc = await asyncio.create_subprocess_exec(binary, "-c", str(mine),
                                                stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(10):  # listening, or the reason it is not
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if proc.returncode is not None:
                        assert proc.stderr is not None
                        pytest.fail(f"mosquitto exited: {(await proc.stderr.read()).decode()}")
                    await asyncio.sleep(0.05)
        yield
    finally:
        if proc.returncode is None:
            proc.terminate()
        await proc.wait()


async def test_broker_config_binds_every_host_to_its_own_topics(
        tmp_path: Path, start_rig: StartRig) -> None:
    name = unique_name("acl")
    parts = (endpoint("h1.nic0"), endpoint("h2.nic0"), host("h1", emulate=False),
             host("h2", emulate=False))
    _, lab_path = write_lab(tmp_path, "acl", *parts, name=name)
    port, out = free_port(), tmp_path / "mqtt"
    code, printed, err = await run("broker-config", str(lab_path), "--out", str(out),
                                   "--port", str(port), "--client", "ci")
    assert code == 0, err
    assert "hosts/HOST.toml" in printed
    for secret in ("daemon.toml", "hosts/h1.toml", "hosts/h2.toml", "clients/ci.toml",
                   "passwd"):
        assert stat.S_IMODE((out / secret).stat().st_mode) == 0o600, secret
    assert read_credentials(out / "hosts/h1.toml").hosts.keys() == {"h1"}  # its own only

    url = f"mqtt://127.0.0.1:{port}"
    root = lab_root(name)
    async with mosquitto(out / "mosquitto.conf", port):
        with pytest.raises(aiomqtt.MqttError):  # anonymous: not authorised
            async with aiomqtt.Client("127.0.0.1", port) as anonymous:
                await anonymous.publish(f"{root}/hosts/h1/events", b"{}")

        daemon_bus = BusSettings.load(url, out / "daemon.toml")
        h1 = BusSettings.load(url, out / "hosts/h1.toml").for_host("h1")
        agent = Agent(lab=name, host="h1", mqtt=h1, backend=EmulatedBackend(count=1),
                      interval=0.2)
        async with start_rig("acl", *parts, name=name, mqtt=daemon_bus, token="t") as rig:
            daemon = rig.daemon
            assert daemon.bus is not None
            await daemon.bus.wait_sessions(1, timeout=10)
            _, sub = daemon.hub.subscribe()
            task = asyncio.create_task(agent.run())
            try:
                # h1 logs in with its own file and is believed.
                event = await next_event(sub, "gpu.health")
                assert event.data["host"] == "h1"

                # h2, logged in as itself, tries to speak for h1: the broker drops it. Then
                # an unsigned message on its own topic, which the broker lets through and
                # the daemon refuses: once that refusal is in, the first would have been.
                h2 = read_credentials(out / "hosts/h2.toml")
                async with aiomqtt.Client("127.0.0.1", port, username=h2.username,
                                          password=h2.password) as rogue:
                    forged = f"{root}/hosts/h1/events"
                    await rogue.publish(forged, Sealer("h2", h2.hosts["h2"]).seal(
                        forged, '{"gpu": 0, "health": "failed"}'), qos=1)
                    await rogue.publish(f"{root}/hosts/h2/heartbeat", b"{}", qos=1)
                    warning = await next_event(sub, "warning")
                assert "host h2 refused" in warning.data["detail"]
                assert daemon.bus.complain.count == 1
                assert daemon.hosts.hosts["h1"].gpu_health(0) == "healthy"
            finally:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                sub.close()


@pytest.mark.parametrize(("args", "listener", "warned"), [
    ((), "127.0.0.1", False),
    (("--bind", "0.0.0.0"), "0.0.0.0", True),
    (("--bind", "::1"), "::1", False),
    (("--bind", "localhost"), "localhost", False),
    (("--bind", "broker.lab"), "broker.lab", True),
])
async def test_a_plain_listener_stays_on_loopback_unless_told(
        tmp_path: Path, args: tuple[str, ...], listener: str, warned: bool) -> None:
    """The issue's case: the plain listener listened on every interface, without a word,
    and without set_tcp_nodelay (docs/daemon.md recommends it)."""
    _, lab_path = write_lab(tmp_path, "bind", endpoint("h1.nic0"), host("h1", emulate=False))
    port, out = free_port(), tmp_path / "mqtt"
    code, _, err = await run("broker-config", str(lab_path), "--out", str(out),
                             "--port", str(port), *args)
    assert code == 0, err
    lines = (out / "mosquitto.conf").read_text().splitlines()
    assert f"listener {port} {listener}" in lines and "set_tcp_nodelay true" in lines
    if warned:
        (line,) = err.splitlines()  # one line, however wide the terminal
        assert line.startswith("warning: ") and f"{listener} port {port}" in line
        assert "in clear" in line and "--tls-cert" in line
    else:
        assert err == ""
    if listener in ("127.0.0.1", "0.0.0.0"):  # the real broker takes the file
        async with mosquitto(out / "mosquitto.conf", port):
            bus = BusSettings.load(f"mqtt://127.0.0.1:{port}", out / "daemon.toml")
            async with aiomqtt.Client(**bus.login()) as client:
                await client.publish(f"{lab_root(read_credentials(out / 'daemon.toml').lab)}"
                                     "/daemon", b"online", qos=1)


@pytest.mark.parametrize("bind", ["a b", "127.0.0.1\nlistener 1", "", "-x", "[::1]"])
async def test_broker_config_refuses_a_bind_address_it_cannot_use(tmp_path: Path,
                                                                  bind: str) -> None:
    _, lab_path = write_lab(tmp_path, "bindbad", endpoint("h1.nic0"), host("h1", emulate=False))
    out = tmp_path / "m"
    code, _, err = await run("broker-config", str(lab_path), "--out", str(out), "--bind", bind)
    assert code == 2 and "--bind" in err and "Traceback" not in err, err
    assert not out.exists()  # nothing written


def openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        pytest.fail("this test needs the openssl command (Debian: openssl) to make certificates")
    subprocess.run([binary, *args], cwd=cwd, check=True, capture_output=True, timeout=60)


#: The extensions a strict verifier requires (Python 3.13's default context checks with
#: VERIFY_X509_STRICT, RFC 5280): a CA says it signs certificates, a leaf names its CA's key.
#: Written out here, so the certificates do not depend on the machine's openssl.cnf.
CA_CONFIG = """[req]
distinguished_name = dn
x509_extensions = ca
prompt = no
[dn]
CN = labd test CA
[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
"""
LEAF_EXTENSIONS = """subjectAltName = IP:127.0.0.1
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
"""


def certificates(folder: Path) -> tuple[Path, Path, Path]:
    """A test CA, and a broker certificate for 127.0.0.1 signed by it: (ca, cert, key)."""
    folder.mkdir()
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    (folder / "ca.cnf").write_text(CA_CONFIG)
    openssl("req", "-x509", "-config", "ca.cnf", *ec, "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", cwd=folder)
    openssl("req", *ec, "-keyout", "broker.key", "-out", "broker.csr",
            "-subj", "/CN=127.0.0.1", cwd=folder)
    (folder / "san").write_text(LEAF_EXTENSIONS)
    openssl("x509", "-req", "-in", "broker.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "broker.pem", "-days", "2", "-extfile", "san", cwd=folder)
    return folder / "ca.pem", folder / "broker.pem", folder / "broker.key"


async def test_broker_config_with_certificates_takes_tls_only(tmp_path: Path) -> None:
    ca, cert, key = certificates(tmp_path / "tls")
    name = unique_name("tls")
    _, lab_path = write_lab(tmp_path, "tls", endpoint("h1.nic0"), host("h1", emulate=False),
                            name=name)
    port, out = free_port(), tmp_path / "mqtt"
    code, printed, err = await run("broker-config", str(lab_path), "--out", str(out),
                                   "--port", str(port), "--tls-cert", str(cert),
                                   "--tls-key", str(key), "--tls-ca", str(ca))
    assert code == 0, err
    assert f"mqtts://BROKER:{port}" in printed
    # TLS: on every interface (what it is for), without a warning.
    assert f"listener {port}" in (out / "mosquitto.conf").read_text().splitlines()
    assert err == ""
    assert read_credentials(out / "hosts/h1.toml").tls == {"ca": str(ca.resolve())}

    url = f"mqtts://127.0.0.1:{port}"
    topic = f"{lab_root(name)}/hosts/h1/heartbeat"
    async with mosquitto(out / "mosquitto.conf", port):
        daemon = BusSettings.load(url, out / "daemon.toml")
        h1 = BusSettings.load(url, out / "hosts/h1.toml").for_host("h1")
        async with aiomqtt.Client(**daemon.login()) as listener:
            await listener.subscribe(topic)
            async with aiomqtt.Client(**h1.login()) as agent:
                await agent.publish(topic, b"over TLS", qos=1)
            message = await next_message(listener.messages, topic)
            assert message.payload == b"over TLS"

        # Without the lab's CA the broker's certificate is not trusted; in clear, the TLS
        # listener does not answer MQTT at all.
        untrusted = BusSettings(url, credentials=replace(daemon.credentials, tls={}))
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client(**untrusted.login(), timeout=5):
                pass
        with pytest.raises(aiomqtt.MqttError):
            async with aiomqtt.Client(**BusSettings.load(
                    f"mqtt://127.0.0.1:{port}", out / "daemon.toml").login(), timeout=5):
                pass


async def test_broker_config_refuses_half_a_tls_setup(tmp_path: Path) -> None:
    _, lab_path = write_lab(tmp_path, "half", endpoint("h1.nic0"), host("h1", emulate=False))
    code, _, err = await run("broker-config", str(lab_path), "--out", str(tmp_path / "m"),
                             "--tls-cert", str(tmp_path / "nope.pem"))
    assert code != 0 and "--tls-cert and --tls-key go together" in err


@pytest.mark.parametrize("name", ["../x", "a/b", "ok\nuser evil", "a b", "+", "#", "-x",
                                  "", "x" * 65])
async def test_broker_config_refuses_a_client_name_it_cannot_use(tmp_path: Path,
                                                                  name: str) -> None:
    """The review's case: a --client name went into a file path (clients/../x.toml) and an
    ACL 'user' line (a newline added lines of its own)."""
    _, lab_path = write_lab(tmp_path, "names", endpoint("h1.nic0"), host("h1", emulate=False))
    out = tmp_path / "m"
    code, _, err = await run("broker-config", str(lab_path), "--out", str(out),
                             "--client", "ok", "--client", name)
    assert code != 0 and "--client name" in err and "cannot be used" in err, err
    assert "Traceback" not in err and not out.exists()  # nothing written


def test_the_acl_takes_no_name_that_would_add_lines() -> None:
    from labd.errors import BusError
    from labd.mqtt.mosquitto import acl

    assert "user lab.client.ci-1" in acl("labd/lab", "lab", ["h1"], ["ci-1"])
    for hosts, clients in ((["h1\ntopic readwrite #"], []), ([], ["c\nuser x"])):
        with pytest.raises(BusError, match="cannot be used"):
            acl("labd/lab", "lab", hosts, clients)
