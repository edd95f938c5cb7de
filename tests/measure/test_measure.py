"""``labd measure reconfig / runs / show / compare`` as a user runs them (subprocesses),
on an emulated lab whose timing model the campaign sets."""

import asyncio
import csv
import signal
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from labd import deadlines
from labd.errors import RunError
from labd.measure.runs import RunStore
from tests.broker import MQTT, require_broker
from tests.commands.test_cli import LABD, run
from tests.labs import meter, metered, switch, write_lab
from tests.rigs import StartRig

#: ocs1 as the lab file has it (3 ms): the campaigns set other timing models, and the tests
#: tell by the emulator's record which one it switched with.
OCS1 = switch(technology="beam-steering", switch_ms=3)


def lab_file(tmp_path: Path) -> Path:
    return write_lab(tmp_path, "measured", OCS1)[1]


def within(seconds: float) -> float:
    """A test's own limit, on the suite's deadline scale (tests/conftest.py)."""
    return deadlines.current().times(seconds)


async def rows_in(runs: Path, name: str, at_least: int, timeout: float = 60) -> int:
    """Wait until the run holds ``at_least`` rows (another process writes them; the file
    is all there is to watch)."""
    deadline = time.monotonic() + within(timeout)
    while True:
        try:
            store = RunStore(runs)
            try:
                count = len(store.rows(store.get(name)))
            finally:
                store.close()
        except RunError:
            count = 0
        if count >= at_least:
            return count
        assert time.monotonic() < deadline, f"run {name} has {count} rows, not {at_least}"
        await asyncio.sleep(0.05)


@pytest.mark.timeout(240)  # its waits together (tests/conftest.py scales it)
async def test_ctrl_c_keeps_what_was_measured_and_resume_goes_on(tmp_path: Path) -> None:
    lab, runs = lab_file(tmp_path), tmp_path / "runs.sqlite"
    args = ["measure", "reconfig", "--lab", str(lab), "--pattern", "random", "-k", "2",
            "--rounds", "60", "--seed", "3", "--switch-ms", "5", "--jitter-ms", "0.5",
            "--runs", str(runs)]
    proc = await asyncio.create_subprocess_exec(
        *LABD, *args, "--name", "r1", stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        await rows_in(runs, "r1", 6)
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(within(30)):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, err.decode()
    assert "Traceback" not in out.decode() + err.decode()
    store = RunStore(runs)
    interrupted = store.get("r1")
    kept = len(store.rows(interrupted))
    store.close()
    assert interrupted.status == "interrupted" and 6 <= kept < 60
    assert f"{kept} of 60 rows kept in run r1" in " ".join(out.decode().split())

    code, out, err = await run("measure", "reconfig", "--lab", str(lab), "--resume", "r1",
                               "--runs", str(runs), timeout=within(120))
    assert code == 0, out + err
    assert f"{kept} already measured" in out
    store = RunStore(runs)
    done = store.get("r1")
    rows = store.rows(done)
    store.close()
    assert done.status == "complete" and len(rows) == 60
    assert [r["round"] for r in rows] == list(range(60))  # nothing twice, nothing missing
    assert done.params["timing"]["switch_time_ms"] == 5 and len(done.lab_sha256) == 64
    # The timing model was set again on resuming (the lab file says 3 ms): the emulator's
    # own record of every change after the interruption is 5 ± 0.5 ms.
    resumed = [r["truth_ms"] for r in rows[kept:] if "truth_ms" in r]
    assert len(resumed) >= 60 - kept - 1 and all(4.4 < t < 6.5 for t in resumed), resumed
    assert "Timing model 5 ± 0.5 ms" in out


@pytest.mark.timeout(300)  # its waits together (tests/conftest.py scales it)
async def test_runs_are_shown_exported_and_compared(tmp_path: Path) -> None:
    lab, runs = lab_file(tmp_path), tmp_path / "runs.sqlite"
    for name, ms in (("slow", "8"), ("fast", "2")):
        code, out, err = await run("measure", "reconfig", "--lab", str(lab), "--rounds", "8",
                                   "--switch-ms", ms, "--runs", str(runs), "--name", name,
                                   timeout=within(120))
        assert code == 0, out + err
    code, out, _ = await run("measure", "compare", "slow", "fast", "--runs", str(runs))
    assert code == 0
    # The emulators' own record of each change: what each run's model was set to.
    truth = next(line for line in out.splitlines() if "│ truth p50 " in line)
    cells = [c.strip() for c in truth.split("│") if c.strip()]
    p50_slow, p50_fast, said = float(cells[3]), float(cells[4]), cells[6]
    assert 7.9 < p50_slow < 8.5 and 1.9 < p50_fast < 2.5
    assert said == "faster" and cells[5].startswith("-6.")
    assert any("│ device p50 " in line for line in out.splitlines())
    csv_path, parquet, plots = tmp_path / "a.csv", tmp_path / "a.parquet", tmp_path / "plots"
    code, out, err = await run("measure", "show", "fast", "--runs", str(runs), "--csv",
                               str(csv_path), "--parquet", str(parquet), "--plots", str(plots))
    assert code == 0, out + err
    assert "8 reconfigurations (none failed)" in out
    with csv_path.open() as f:
        table = list(csv.DictReader(f))
    assert len(table) == 8 and {r["run"] for r in table} == {"fast"}
    assert all(float(r["device_ms"]) > 1.0 for r in table)
    assert pq.read_table(parquet).num_rows == 8
    assert (plots / "fast-cdf.png").read_bytes()[:4] == b"\x89PNG"
    # The kept run says what it was measured on: the lab, emulated, the switch's model.
    code, out, err = await run("measure", "show", "fast", "--runs", str(runs), "--plots",
                               str(plots), "--format", "svg")
    assert code == 0, out + err
    title = [e.text or "" for e in ET.parse(plots / "fast-cdf.svg").iter(
        "{http://www.w3.org/2000/svg}text")]
    assert any(t.startswith("lab measured") and t.endswith(", emulated") for t in title)
    assert "reconfiguration times (run fast)" in title
    assert any(t.startswith("ocs1: Polatis") for t in title) and "2 ± 0 ms model" in title
    code, out, _ = await run("measure", "runs", "--runs", str(runs))
    assert code == 0 and "slow" in out and "fast" in out and "complete" in out


@pytest.mark.timeout(480)  # its waits together (tests/conftest.py scales it)
async def test_bad_parameters_are_refused_before_anything_runs(tmp_path: Path) -> None:
    lab, runs = lab_file(tmp_path), tmp_path / "runs.sqlite"
    base = ["measure", "reconfig", "--lab", str(lab), "--runs", str(runs)]
    for extra, words in ((["--pattern", "zigzag"], "pattern 'zigzag'"),
                         (["--rounds", "0"], "rounds 0"),
                         (["--pattern", "random", "-k", "9"], "only 8 free pairs"),
                         (["--switch", "nope"], "no switch 'nope'"),
                         (["--resume", "nosuch"], "no run 'nosuch'"),
                         (["--switch-ms", "2", "--jitter-ms", "3"], "jitter")):
        code, out, err = await run(*base, *extra, timeout=within(60))
        assert code == 2, (extra, out, err)
        assert words in " ".join((out + err).split()), (extra, out, err)
        assert "Traceback" not in out + err
    code, out, err = await run("measure", "reconfig", "--switch-ms", "2", "--runs", str(runs))
    assert code == 2 and "needs --lab" in out + err
    # A model slower than the light window, on a switch with a metered path.
    _, tapped = write_lab(tmp_path, "measured", OCS1, meter(),
                          metered("tx", "rx", 1, 9, 1), file="metered.toml")
    code, out, err = await run("measure", "reconfig", "--lab", str(tapped), "--runs",
                               str(runs), "--switch-ms", "120", timeout=within(60))
    said = " ".join((out + err).split())
    assert code == 2 and "ocs1's light window is 100 ms" in said and "--no-light" in said
    store = RunStore(runs)
    assert store.all() == []  # nothing was started, so nothing was kept
    store.close()


@pytest.mark.timeout(360)  # its waits together (tests/conftest.py scales it)
async def test_failover_drills_are_kept_and_resumed(tmp_path: Path) -> None:
    require_broker()  # the session's, not whatever this machine may run on 1883
    runs = tmp_path / "runs.sqlite"
    args = ["measure", "failover", "-n", "5", "--lost", "1", "--seed", "4", "--runs",
            str(runs), "--name", "f1", "--mqtt", MQTT]
    proc = await asyncio.create_subprocess_exec(*LABD, *args, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    try:
        await rows_in(runs, "f1", 1, timeout=90)
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(within(60)):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, (out + err).decode()
    store = RunStore(runs)
    kept = len(store.rows(store.get("f1")))
    store.close()
    assert 1 <= kept < 6
    code, out, err = await run("measure", "failover", "--resume", "f1", "--runs", str(runs),
                               "--mqtt", MQTT, "--csv", str(tmp_path / "f.csv"),
                               timeout=within(180))
    assert code == 0, out + err
    store = RunStore(runs)
    done = store.get("f1")
    rows = store.rows(done)
    store.close()
    assert done.status == "complete" and len(rows) == 6
    assert [r["kind"] for r in rows] == ["gpu"] * 5 + ["host"]  # as first asked
    assert all(r["outcome"] == "recovered" and r["ms"]["first_step"] > 0 for r in rows)
    with (tmp_path / "f.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 6


@pytest.mark.timeout(180)  # its waits together (tests/conftest.py scales it)
async def test_a_running_daemon_is_measured_with_the_emulators_truth(
        tmp_path: Path, start_rig: StartRig) -> None:
    """--url with --control: the daemon and its emulators run elsewhere; the campaign reads
    the emulators' ground truth and sets their timing model through the control endpoint."""
    # apart: the emulators in a `labd emulate` process of their own.
    async with start_rig("measured", OCS1, token="tok", apart=True) as rig:
        daemon = rig.daemon
        runs = tmp_path / "runs.sqlite"
        key = tmp_path / "key"
        key.write_text("tok\n")
        key.chmod(0o600)
        code, out, err = await run(
            "measure", "reconfig", "--url", daemon.url, "--token-file", str(key), "--control",
            rig.control_url, "--rounds", "6", "--switch-ms", "4", "--runs", str(runs),
            "--name", "remote", timeout=within(120))
        assert code == 0, out + err
        assert "Timing model 4 ± 0 ms" in out
    store = RunStore(runs)
    measured = store.get("remote")
    rows = store.rows(measured)
    store.close()
    assert measured.target == daemon.url and measured.params["timing"]["switches"] == ["ocs1"]
    assert len(rows) == 6 and all(3.9 < r["truth_ms"] < 5 for r in rows)  # set, not 3 ms
