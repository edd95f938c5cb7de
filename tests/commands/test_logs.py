"""labd's logs: levels per module, JSON lines for collectors, a rotated file, names of
instruments and hosts as fields, and no secret in any line (nor anywhere else a `labd run`
process writes)."""

import io
import json
import logging
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
    appears in anything it writes, raw bytes logged and a reconnect (a new login) included."""
    _, lab = write_lab(
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
        assert await daemon.stop(timeout=deadlines.current().times(10)) == 0
    finally:
        await daemon.close()
    assert daemon.not_json == [] and daemon.logs
    assert all({"ts", "level", "logger", "message"} <= line.keys() for line in daemon.logs)
    about_ocs1 = [line for line in daemon.logs if line.get("instrument") == "ocs1"]
    assert any("connected" in line["message"] for line in about_ocs1)
    assert any(line.get("host") == "h0" for line in daemon.logs)
    assert any("ENT-PATCH" in line["message"] for line in daemon.logs)  # raw bytes logged
    assert TOKEN not in daemon.output and TL1_PASSWORD not in daemon.output
