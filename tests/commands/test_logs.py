"""labd's logs: levels per module, JSON lines for collectors, a rotated file, names of
instruments and hosts as fields, and no secret in any line (nor anywhere else a `labd run`
process writes)."""

import asyncio
import io
import json
import logging
import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from labd import deadlines
from labd.logs import (
    LogSettingsError,
    about,
    add_secrets,
    configure,
    level_for,
    parse_levels,
)
from tests.commands.running import Running
from tests.labs import endpoint, host, instrument, write_lab

TOKEN = "tok-never-LOGGED-4f1c9e"
TL1_PASSWORD = "tl1-never-LOGGED-7d2a"
#: The key a host's agent is given: not one the daemon takes, so the agent logs why.
AGENT_KEY = "agent-key-never-LOGGED-93ab"


@pytest.fixture
def root_logging() -> Iterator[None]:
    """The test's own logging set-up, undone afterwards (pytest's capture handlers back)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)
    for name in ("labd.fabric", "instruments.wire", "test.logs"):
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_levels_per_module() -> None:
    assert parse_levels("info,labd.fabric=debug, instruments.wire=warning") == (
        logging.INFO, {"labd.fabric": logging.DEBUG, "instruments.wire": logging.WARNING})
    assert parse_levels("labd.fabric=debug") == (logging.WARNING, {"labd.fabric": 10})
    for bad, why in [("loud", "'loud' is no level"), ("info,debug", "two levels"),
                     ("info,labd..x=debug", "is no logger name"),
                     ("a=info,a=debug", "given twice")]:
        with pytest.raises(LogSettingsError, match=why):
            parse_levels(bad)
    assert (level_for(0, None), level_for(1, None), level_for(2, None)) == (
        "warning", "info", "debug")
    assert level_for(2, "error") == "error"  # an option given wins over -v


def test_json_lines_carry_names_and_never_a_secret(root_logging: None) -> None:
    stream = io.StringIO()
    configure("info,test.logs=debug", "json", stream=stream, secrets=["s3cr3t-value"])
    log = logging.getLogger("test.logs")
    log.debug("login with %s", "s3cr3t-value", extra={"instrument": "ocs1"})
    about(log, host="h0").warning("host report")
    try:
        raise RuntimeError("failed near s3cr3t-value")
    except RuntimeError:
        log.exception("it broke", extra={"instrument": "ocs2"})
    logging.getLogger("elsewhere").debug("not shown: the root is at info")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["level"], line["logger"]) for line in lines] == [
        ("debug", "test.logs"), ("warning", "test.logs"), ("error", "test.logs")]
    assert lines[0]["message"] == "login with ***" and lines[0]["instrument"] == "ocs1"
    assert lines[1]["host"] == "h0" and "instrument" not in lines[1]
    assert "RuntimeError: failed near ***" in lines[2]["exception"]
    assert lines[0]["ts"].endswith("Z")
    assert "s3cr3t-value" not in stream.getvalue()


def test_text_lines_and_a_rotated_file(root_logging: None, tmp_path: Path) -> None:
    file = tmp_path / "labd.log"
    configure("info", "human", file, max_bytes=4096, backups=2)
    log = logging.getLogger("test.logs")
    for i in range(200):
        log.info("line %d of the rotation test", i, extra={"instrument": "ocs1"})
    logging.getLogger().handlers[0].flush()
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == ["labd.log", "labd.log.1", "labd.log.2"]  # the rest rotated away
    last = file.read_text().splitlines()[-1]
    assert last.endswith("INFO test.logs: line 199 of the rotation test [instrument=ocs1]")
    with pytest.raises(LogSettingsError, match="log file"):
        configure("info", "human", tmp_path / "no" / "such" / "dir.log")


def test_short_secrets_are_not_searched_for(root_logging: None) -> None:
    stream = io.StringIO()
    add_secrets("ab")  # would garble every line; protects nothing
    configure("info", "json", stream=stream)
    logging.getLogger("test.logs").info("about a tab")
    assert json.loads(stream.getvalue())["message"] == "about a tab"


async def test_labd_run_logs_json_lines_with_names_and_no_secret(tmp_path: Path) -> None:
    """A TL1 switch with a password, a host, a token: every stderr line of the daemon is a
    JSON object, the lines about the switch and the host name them, and neither secret
    appears in anything it writes, raw bytes logged and a reconnect (a new login) included.
    The host's agent, refused for a key the daemon does not take, logs JSON lines naming
    its host, and its key appears in neither process's output."""
    name, lab = write_lab(
        tmp_path, "logs",
        instrument("ocs1", "polatis-tl1", size="8x8", user="admin", password=TL1_PASSWORD,
                   watch_interval_s=0),
        endpoint("h0.nic0"), host("h0", emulate=False))
    daemon = await Running.start(
        str(lab), "--db", str(tmp_path / "s.sqlite"), "--port", "0", "--log-format", "json",
        "--log-level", "debug", env={"LABD_TOKEN": TOKEN})
    try:
        url, control = await daemon.url(), await daemon.control()
        logins = len([line for line in daemon.logs if "ACT-USER" in line["message"]])
        async with httpx.AsyncClient(base_url=url, headers={
                "Authorization": f"Bearer {TOKEN}"}) as http:
            r = await http.post("/v1/switches/ocs1/connections", json={"pairs": [[1, 9]]})
            assert r.status_code == 200, r.text
            refused = await http.get("/v1/switches", headers={
                "Authorization": f"Bearer {TOKEN}-wrong"})
            assert refused.status_code == 401
            # The link cut: the daemon logs in again (its password on the wire once more).
            await http.post(f"{control}/v1/emulators/ocs1/faults",
                            json={"kind": "drop", "now": True})
        await daemon.log("the login after the reconnect", lambda _: len(
            [line for line in daemon.logs if "ACT-USER" in line["message"]]) > logins,
            timeout=deadlines.current().of("resync"))
        agent_code, agent_out, agent_logs = await refused_agent(name, url)
        assert await daemon.stop(timeout=deadlines.current().times(10)) == 0
    finally:
        await daemon.close()
    assert daemon.not_json == [] and daemon.logs
    assert all({"ts", "level", "logger", "message"} <= line.keys() for line in daemon.logs)
    about_ocs1 = [line for line in daemon.logs if line.get("instrument") == "ocs1"]
    assert any("connected" in line["message"] for line in about_ocs1)
    assert any(line.get("host") == "h0" for line in daemon.logs)
    assert any("ENT-PATCH" in line["message"] for line in daemon.logs)  # raw bytes logged
    # Every line of bytes on the wire names its instrument as a field.
    wire = [line for line in daemon.logs if line["logger"] == "instruments.wire"]
    assert wire and all(line.get("instrument") == "ocs1" for line in wire)
    assert TOKEN not in daemon.output and TL1_PASSWORD not in daemon.output
    assert AGENT_KEY not in daemon.output
    # The agent: JSON lines, the refusal naming its host, its key nowhere.
    assert agent_code == 0, agent_out
    refusals = [line for line in agent_logs if "cannot reach the daemon" in line["message"]]
    assert refusals and all(line["host"] == "h0" for line in refusals)
    assert "401" in refusals[0]["message"]
    assert AGENT_KEY not in agent_out and TOKEN not in agent_out


async def refused_agent(lab: str, url: str) -> tuple[int, str, list[dict[str, object]]]:
    """``labd agent`` for host h0 at debug level, JSON logs, a key the daemon refuses: run
    until it has logged the refusal, then stopped. Its exit code, all it wrote, and its
    stderr's lines as JSON (a line that is not JSON fails the test)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("LABD_") or k == deadlines.SCALE_ENV}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", "agent", "--host", "h0", "--lab", lab,
        "--daemon", url, "--backend", "emulated", "--gpus", "1", "--log-format", "json",
        "--log-level", "debug", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env={**env, "LABD_TOKEN": AGENT_KEY})
    assert proc.stderr is not None and proc.stdout is not None
    errors: list[str] = []
    try:
        async with asyncio.timeout(deadlines.current().of("process_ready")):
            while not any("cannot reach the daemon" in line for line in errors):
                line = await proc.stderr.readline()
                assert line, f"labd agent ended before it was refused:\n{''.join(errors)}"
                errors.append(line.decode())
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(deadlines.current().times(10)):
            out, rest = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    errors += rest.decode().splitlines(keepends=True)
    assert proc.returncode is not None
    printed = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
    assert printed and all(line["logger"] == "labd.agent" for line in printed)
    return proc.returncode, out.decode() + "".join(errors), [
        json.loads(line) for line in errors if line.strip()]


def test_libraries_are_quiet_unless_named(root_logging: None) -> None:
    stream = io.StringIO()
    try:
        configure("info", "json", stream=stream)
        logging.getLogger("alembic.runtime.migration").info("Context impl SQLiteImpl.")
        logging.getLogger("uvicorn.access").info("GET /v1/health 200")
        logging.getLogger("sqlalchemy.engine").warning("a warning still shows")
        assert [json.loads(line)["logger"] for line in stream.getvalue().splitlines()] == [
            "sqlalchemy.engine"]
        configure("warning,alembic=info", "json", stream=stream)
        logging.getLogger("alembic.runtime.migration").info("asked for")
        assert "asked for" in stream.getvalue()
    finally:
        for name in ("alembic", "sqlalchemy", "aiomqtt", "uvicorn", "httpx", "httpcore"):
            logging.getLogger(name).setLevel(logging.NOTSET)


def test_what_a_command_prints_becomes_json_lines() -> None:
    from labd.logs import JsonLines

    out = io.StringIO()
    stream = JsonLines(out, "labd.run")
    stream.write("labd run: lab demo, API http://127.0.0.1:1/v1\n\n  ok  ocs1 Pola")
    stream.write("tis\n")
    stream.flush()
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["level"], line["logger"], line["message"]) for line in lines] == [
        ("info", "labd.run", "labd run: lab demo, API http://127.0.0.1:1/v1"),
        ("info", "labd.run", "ok  ocs1 Polatis")]


async def test_an_outage_in_a_json_session_is_a_warning_and_every_line_json(
        tmp_path: Path) -> None:
    """``labd run --log-format json`` at the default level on an emulated switch powered
    off and on: every line on stdout and stderr (the start-up report too) parses as JSON,
    the outage and the return are one WARNING line each, and no library's INFO line (no
    Alembic's) is there."""
    _, lab = write_lab(tmp_path, "json-session",
                       instrument("ocs1", "polatis-scpi", size="8x8", watch_interval_s=0.1))
    daemon = await Running.start(str(lab), "--db", str(tmp_path / "s.sqlite"), "--port", "0",
                                 "--log-format", "json", env={"LABD_TOKEN": TOKEN})
    try:
        control = await daemon.control()
        async with httpx.AsyncClient(base_url=control) as http:
            (await http.put("/v1/emulators/ocs1/power", json={"on": False})).raise_for_status()
            offline = await daemon.log("ocs1 offline", lambda line: line.get(
                "instrument") == "ocs1" and "offline" in line["message"])
            (await http.put("/v1/emulators/ocs1/power", json={"on": True})).raise_for_status()
            back = await daemon.log("ocs1 back", lambda line: line.get(
                "instrument") == "ocs1" and "back online" in line["message"],
                timeout=deadlines.current().of("resync"))
        assert await daemon.stop(timeout=deadlines.current().times(10)) == 0
    finally:
        await daemon.close()
    assert offline["level"] == "warning" and back["level"] == "warning"
    assert [line for line in daemon.logs if line["message"] == offline["message"]] == [offline]
    assert daemon.not_json == []
    printed = [json.loads(line) for line in daemon.stdout if line.strip()]
    assert any("API http" in line["message"] for line in printed)  # the start-up report
    assert not [line for line in daemon.logs if line["logger"].startswith(
        ("alembic", "sqlalchemy", "uvicorn", "aiomqtt"))]
