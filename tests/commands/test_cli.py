"""The labd command as a user runs it: real subprocesses."""

import asyncio
import json
import signal
import sqlite3
import sys
from pathlib import Path

import httpx
import pytest

from emulators import EmulatedLab
from labd.lab.loader import load_lab
from tests.broker import MQTT, require_broker

LABD = [sys.executable, "-m", "labd"]


async def run(*args: str, timeout: float = 60) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(*LABD, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(timeout):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:  # timed out or cancelled: leave nothing running
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_emulate_demo_prints_endpoints_then_ready_and_stops_on_sigint(
        tmp_path: Path) -> None:
    resolved = tmp_path / "resolved.toml"
    proc = await asyncio.create_subprocess_exec(
        *LABD, "emulate", "demo", "--resolved", str(resolved),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None
    try:
        lines = []
        while True:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
            assert line, "labd emulate exited early"
            lines.append(json.loads(line))
            if "ready" in lines[-1]:
                break
        *emulators, ready = lines
        assert [e["id"] for e in emulators] == ["ocs1", "ocs2", "ocs3", "mesh1", "pm1", "pm2"]
        assert [e["driver"] for e in emulators] == [
            "polatis-scpi", "polatis-tl1", "calient-tl1", "qontrol-mesh", "keysight-n77xx",
            "thorlabs-pm100"]
        assert emulators[3]["endpoint"].startswith("serial:///dev/pts/")  # a USB-serial board
        assert all(e["endpoint"].startswith("tcp://127.0.0.1:")
                   for e in emulators if e["id"] != "mesh1")
        assert ready["ready"] is True
        async with httpx.AsyncClient(base_url=ready["control"]) as http:
            listing = (await http.get("/v1/emulators")).json()
        assert {e["id"] for e in listing} == {"ocs1", "ocs2", "ocs3", "mesh1", "pm1", "pm2"}
        host, port = emulators[0]["endpoint"].removeprefix("tcp://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"*IDN?\n")
        assert (await asyncio.wait_for(reader.readline(), 5)).startswith(b"Polatis,")
        writer.close()
        lab = load_lab(resolved)
        assert [e.address for e in lab.instrument] == [e["endpoint"] for e in emulators]
        assert len(lab.fiber) > 0  # the wiring travels with it
        assert not any(e.emulate for e in lab.instrument)
    finally:
        proc.send_signal(signal.SIGINT)
        code = await asyncio.wait_for(proc.wait(), 15)
    assert code == 0
    assert proc.stderr is not None
    assert "Traceback" not in (await proc.stderr.read()).decode()


async def test_probe_shows_replies_with_timing(lab: EmulatedLab) -> None:
    code, out, _ = await run("probe", lab.endpoints["ocs1"]["scpi"], "-c", "*IDN?",
                             "-c", ":OXC:SWIT:SIZE?", "--read-term", "\\r\\n")
    assert code == 0
    assert "Polatis,N-OST-16x16-LA1-DMHNS" in out and "16,16" in out
    assert " ms " in out


async def test_probe_tl1_blocks_and_silence(lab: EmulatedLab) -> None:
    code, out, _ = await run("probe", lab.endpoints["ocs1"]["tl1"], "--tl1", "--timeout",
                             "0.3", "-c", "RTRV-PATCH:::1:;", "-c", "ACT-USER::admin:2::root;")
    assert code == 0
    assert "M  1 DENY" in out and "Not logged in" in out and "M  2 COMPLD" in out
    code, out, _ = await run("probe", lab.endpoints["ocs1"]["scpi"], "--timeout", "0.2",
                             "-c", ":OXC:SWIT:DISC:ALL")
    assert code == 0 and "no reply within 0.2 s" in out


@pytest.mark.timeout(240)
async def test_demo_runs_and_exits_zero(tmp_path: Path) -> None:
    require_broker()  # the session's, not whatever this machine may run on 1883
    db = tmp_path / "demo.sqlite"
    code, out, err = await run("demo", "--rounds", "2", "--seed", "1", "--light-events", "4",
                               "--db", str(db), "--mqtt", MQTT, timeout=200)
    assert code == 0, err
    for name in ("ocs1", "ocs2", "ocs3", "mesh1", "pm1", "pm2"):
        assert name in out
    assert "device p50" in out and "Fault drill" in out and "resynchronised" in out
    # Not a terminal: progress as plain lines; the machine's load beside the figures.
    assert "reconfiguring ocs1: started" in out and "reconfiguring ocs1: done" in out
    assert "During the run: load average" in out
    assert "daemon: API http://127.0.0.1:" in out
    assert "Light verification" in out and "logging 10 µs" in out
    # The failover drill and its timeline, stage by stage.
    assert "Failover drill" in out and "(recovered)" in out
    for stage in ("spare_chosen", "switches_acked", "links_up", "job_restarted", "first_step"):
        assert stage in out
    # --db keeps what the demo recorded: the demo lab's changes, and the failover lab's
    # (a store holds one lab) beside it, the drill's timeline among them.
    failover_db = tmp_path / "demo-failover.sqlite"
    with sqlite3.connect(db) as demo_store:
        (changes,) = demo_store.execute("select count(*) from reconfigurations").fetchone()
    with sqlite3.connect(failover_db) as failover_store:
        (timelines,) = failover_store.execute(
            "select count(*) from failover_timelines").fetchone()
    assert changes > 0 and timelines == 1


async def test_user_mistakes_are_messages_not_tracebacks(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[lab]\nname = "x"\n[[instrument]]\nid = "a"\ndriver = "polatis-scpi"\n')
    code, _, err = await run("emulate", str(bad))
    assert code == 2
    assert "error: the lab file has problems" in err and "'address' is required" in err
    assert "[[instrument]] #1 (id 'a')" in err  # lab-file sections are not eaten as markup
    assert "Traceback" not in err
    code, _, err = await run("probe", "10.0.0.1:5025")
    assert code == 2 and "no scheme" in err and "Traceback" not in err
    code, out, err = await run("probe", "tcp://127.0.0.1:1", "-c", "*IDN?")
    assert code == 2 and "cannot open" in out and "Traceback" not in err + out


async def test_agent_and_run_refuse_a_bad_broker_address() -> None:
    code, _, err = await run("agent", "--host", "a", "--lab", "l", "--mqtt", "nonsense:x")
    assert code == 2 and "the port must be a number" in err and "Traceback" not in err
    code, _, err = await run("agent", "--host", "a", "--lab", "l", "--mqtt", "mqtt://h",
                             "--backend", "rocm")
    assert code == 2 and "expected auto, nvml, nvidia-smi or emulated" in err
    code, _, err = await run("agent", "--host", "a", "--lab", "l")
    assert code == 2 and "give one of --mqtt URL" in err
    code, _, err = await run("agent", "--host", "a", "--lab", "l", "--mqtt", "mqtt://h",
                             "--job", "ring4")
    assert code == 2 and "expected JOB=COMMAND" in err and "Traceback" not in err


async def imported(statement: str) -> set[str]:
    """The modules a fresh interpreter loads for ``statement`` (from -X importtime)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-X", "importtime", "-c", statement,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return {line.rsplit("|", 1)[-1].strip() for line in err.decode().splitlines()
            if line.startswith("import time:") and "|" in line}


HEAVY = ("sqlalchemy", "fastapi", "uvicorn", "textual", "instruments", "emulators", "tui")


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if m.split(".")[0] in HEAVY}


async def test_the_agent_command_loads_none_of_the_daemon() -> None:
    modules = await imported("import labd.agent.cli")
    assert "labd.agent.cli" in modules
    assert not heavy(modules)
    assert not {m for m in modules if m.startswith(("labd.daemon", "labd.commands"))}


async def test_the_command_loads_what_a_command_needs_only_when_it_runs() -> None:
    modules = await imported("import labd.commands.main")
    assert "labd.commands.measure" in modules
    assert not heavy(modules)
    assert not {m for m in modules if m.startswith(("labd.daemon", "labd.lab"))}


async def test_the_agent_runs_alone() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd.agent", "--host", "a", "--lab", "l",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 2 and "give one of --mqtt URL" in err.decode()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd.agent", "--help",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0 and "--host" in out.decode() and "--nic" in out.decode()
