"""``labd measure availability`` as a user runs it: a failure profile replayed on an
emulated lab through labd's recovery, kept as a run, shown and compared again."""

import asyncio
import csv
import io
import json
import signal
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from labd import deadlines
from labd.lab.loader import load_lab
from labd.measure.availability import plan_replay, replay
from labd.measure.availability_report import link_up_source, model_of, swept_names
from labd.measure.ettr import MIXNET_LINK_UP_S, ModelInputs
from labd.measure.failures import LLAMA3_405B, sample_trace
from labd.measure.runs import RunStore
from tests.commands.test_cli import LABD, run
from tests.labs import ring_lab, write_lab
from tests.measure.test_availability_model import HOSTILE
from tests.measure.test_measure import rows_in


def within(seconds: float) -> float:
    return deadlines.current().times(seconds)


def squeezed(text: str) -> str:
    """A table's text with its cells' line breaks and borders gone, words one space
    apart (rich wraps a cell's words to the terminal's width)."""
    return " ".join(w for w in text.replace("│", " ").replace("┃", " ").split())


@pytest.mark.timeout(240)
async def test_the_replay_drives_the_planned_failures_through_labds_recovery(
        tmp_path: Path) -> None:
    lab = load_lab(str(write_lab(tmp_path, "avail", ring_lab())[1]))
    inputs = ModelInputs(gpus=LLAMA3_405B.gpus, hours=LLAMA3_405B.hours)
    # A draw with a CPU failure in it (one in seven has none): a host is lost too.
    cpu = LLAMA3_405B.index("cpu")
    seed = next(s for s in range(100) if cpu in sample_trace(
        LLAMA3_405B, inputs.gpus, inputs.hours, np.random.default_rng(s)).classes)
    trace = sample_trace(LLAMA3_405B, inputs.gpus, inputs.hours, np.random.default_rng(seed))
    plan = plan_replay(LLAMA3_405B, trace, inputs, drive=3, minutes=0.05, seed=seed)
    rows = await replay(lab, plan, mqtt=None, console=Console(file=io.StringIO()), seed=5)
    by_class: dict[str, int] = {}
    for row in rows:
        by_class[row["class"]] = by_class.get(row["class"], 0) + 1
    # Every planned failure driven once, of its class, and recovered by a spare swap.
    assert by_class == {k: v for k, v in plan.driven().items() if v}
    assert [r["index"] for r in rows] == [p.index for p in plan.failures]
    assert all(r["outcome"] == "recovered" and r["spare"] for r in rows), rows
    assert {r["kind"] for r in rows} == {"gpu", "host"}
    gpu = next(r for r in rows if r["kind"] == "gpu")
    assert gpu["signal"] == next(p.cls.signal for p in plan.failures if p.cls.path == "gpu")


@pytest.mark.timeout(300)
async def test_a_run_is_kept_shown_exported_and_compared(tmp_path: Path) -> None:
    _, lab = write_lab(tmp_path, "availcli", ring_lab())
    runs, plots = tmp_path / "runs.sqlite", tmp_path / "plots"
    code, out, err = await run(
        "measure", "availability", "--lab", str(lab), "--drive", "3", "--minutes", "0.05",
        "--traces", "20", "--seed", "2", "--runs", str(runs), "--name", "a1",
        "--csv", str(tmp_path / "a1.csv"), "--plots", str(plots), timeout=within(240))
    assert code == 0, err
    said = squeezed(out)
    store = RunStore(runs)
    try:
        params = store.get("a1").params
    finally:
        store.close()
    # The three driven of every failure the draw modelled, on the lab given.
    modelled = sum(params["modelled"].values())
    assert f"3 of {modelled} modelled failures driven on lab availcli" in said, said
    assert "Where the numbers come from" in said and "no real framework" in said
    # The failover-style lab plays no link-up, and the model added none: the sources table
    # says both (its cells wrap beside each other, so it is read from the run).
    assert params["rig_link_up"] == 0.0
    assert link_up_source(params, ModelInputs(gpus=8, hours=1)) == (
        "none added (--link-up-s 0); the lab's hosts play none (link_up_ms = 0)")
    for table in ("optical spare swap (labd)", "checkpoint restart after repair",
                  "standby host, no fabric", "Sweep: ETTR against OCS switching time"):
        assert table in said
    with (tmp_path / "a1.csv").open() as f:
        kept = list(csv.DictReader(f))
    assert len(kept) == 3 and {"class", "links_up_ms", "detected_ms"} <= set(kept[0])
    assert sorted(p.name for p in plots.iterdir()) == [
        f"a1-sweep-{name}.png" for name in ("link-up", "ocs", "rate", "spares")]

    store = RunStore(runs)
    try:
        measured = store.get("a1")
        rows = store.rows(measured)
        assert measured.kind == "availability" and measured.status == "complete"
        assert measured.params["given"] == [] and measured.params["compression"] > 1000
    finally:
        store.close()
    # The same run read back gives the same model.
    code, shown, err = await run("measure", "show", "a1", "--runs", str(runs))
    assert code == 0, err
    ours = model_of(measured.params, rows, sweeps=False).outcome.ettr["optical"]
    assert f"{ours.mean * 100:.2f} %" in shown

    # Timelines a daemon recorded (GET /v1/failovers) stand in for a rig: nothing driven.
    failovers = [{"id": i, "trigger": "gpu-failed", "outcome": "recovered",
                  "since_failure_ms": {"detected": 5.0 + i, "spare_chosen": 6.0 + i,
                                       "switches_acked": 40.0 + i, "links_up": 45.0 + i}}
                 for i in range(4)]
    (tmp_path / "failovers.json").write_text(json.dumps(failovers))
    code, out, err = await run(
        "measure", "availability", "--timelines", str(tmp_path / "failovers.json"),
        "--traces", "20", "--seed", "2", "--runs", str(runs), "--name", "b1",
        "--link-up-s", "mixnet", timeout=within(120))
    assert code == 0, err
    assert "recoveries from 4 recorded failovers" in squeezed(out)
    assert "MixNet (SIGCOMM 2025)" in squeezed(out)
    code, out, err = await run("measure", "compare", "a1", "b1", "--runs", str(runs))
    assert code == 0, err
    assert "links_up p50" in squeezed(out) and "ETTR per strategy" in squeezed(out)


async def test_bad_input_is_one_line_and_keeps_nothing(tmp_path: Path) -> None:
    runs = tmp_path / "runs.sqlite"
    files = {name: str(tmp_path / name) for name in HOSTILE}
    for name, (text, _) in HOSTILE.items():
        (tmp_path / name).write_text(text)
    # A lab whose emulated hosts play MixNet's link-up: its recoveries hold it already.
    _, mixnet = write_lab(tmp_path, "mixnet", ring_lab().replace(
        "heartbeat_s = 0.5", 'heartbeat_s = 0.5\nlink_up_ms = "mixnet"'))
    # The profiles that crashed the command with a traceback, one of each kind.
    crashed = ("half-a-gpu.csv", "mixed-offsets.csv", "wide.csv", "huge-gpus.toml",
               "huge-count.toml")
    for args, words in (*((["--profile", files[name]], name) for name in crashed),
                        (["--gpus", str(LLAMA3_405B.gpus * 56)],
                         "more than the 100,000 the model can cost"),
                        (["--lab", str(mixnet), "--link-up-s", "mixnet"],
                         'hosts play NIC link-up already (link_up_ms "mixnet")'),
                        (["--repair-h", "gpu-x=2"], "--repair-h: no class gpu-x"),
                        (["--restart", "warmup"], "--restart 'warmup': expected NAME=NUMBER"),
                        (["--link-up-s", "soon"], "--link-up-s 'soon'"),
                        (["--profile", "llama4"], "neither a built-in profile"),
                        # An hour of a TPU pod: no failure on a recovery path to drive.
                        (["--profile", "tpuv4", "--hours", "0.01", "--seed", "1"],
                         "has none with a recovery path on the rig"),
                        (["--timelines", "nowhere.json"], "--timelines nowhere.json")):
        code, out, err = await run("measure", "availability", "--runs", str(runs), *args)
        assert code == 2, (args, out, err)
        # One message (the terminal's width may wrap it).
        assert words in " ".join(err.split()) and err.count("error:") == 1, err
        assert "Traceback" not in err, err
    assert not runs.exists() or RunStore(runs).all() == []


@pytest.mark.timeout(300)
async def test_ctrl_c_keeps_the_failures_driven_and_resume_drives_the_rest(
        tmp_path: Path) -> None:
    _, lab = write_lab(tmp_path, "availresume", ring_lab())
    runs = tmp_path / "runs.sqlite"
    # Six failures spread over a minute: time to interrupt after the second.
    proc = await asyncio.create_subprocess_exec(
        *LABD, "measure", "availability", "--lab", str(lab), "--drive", "6", "--minutes", "1",
        "--traces", "20", "--seed", "4", "--runs", str(runs), "--name", "r1",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await rows_in(runs, "r1", 2, timeout=120)
        proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(within(30)):
            out, err = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 130, err.decode()
    store = RunStore(runs)
    try:
        interrupted = store.get("r1")
        kept = len(store.rows(interrupted))
    finally:
        store.close()
    assert interrupted.status == "interrupted" and 2 <= kept < 6
    assert f"{kept} of 6 rows kept in run r1" in " ".join(out.decode().split())

    code, out2, err2 = await run("measure", "availability", "--resume", "r1", "--runs",
                                 str(runs), timeout=within(180))
    assert code == 0, out2 + err2
    store = RunStore(runs)
    try:
        done = store.get("r1")
        rows = store.rows(done)
    finally:
        store.close()
    assert done.status == "complete" and len(rows) == 6
    # Each planned failure once, in the trace's order: nothing twice, nothing missing.
    indexes = [r["index"] for r in rows]
    assert indexes == sorted(set(indexes))


def test_the_link_up_is_counted_once_and_its_source_said() -> None:
    inputs = ModelInputs(gpus=8, hours=1)
    # A lab whose hosts play MixNet's link-up: the recoveries hold it, the model adds none,
    # and the sweep that would add more on top is left out.
    said = link_up_source({"rig_link_up": "mixnet", "given": []}, inputs)
    assert said.startswith("none added (--link-up-s 0); the lab's hosts play link_up_ms = "
                           '"mixnet"') and "sweep is left out" in said
    assert "link-up" not in swept_names({"rig_link_up": "mixnet"})
    assert "link-up" not in swept_names({"rig_link_up": 250.0})
    # None played: the sweep stays, and --link-up-s mixnet is MixNet's.
    mixnet = ModelInputs(gpus=8, hours=1, link_up_s=MIXNET_LINK_UP_S)
    said = link_up_source({"rig_link_up": 0.0, "given": ["link-up"]}, mixnet)
    assert said.startswith("MixNet (SIGCOMM 2025)") and "play none" in said
    assert "link-up" in swept_names({"rig_link_up": 0.0})
    # Recorded recoveries from a rack: real NICs' link-up is in them.
    said = link_up_source({"timelines": "f.json", "rig_link_up": None, "given": []}, inputs)
    assert "holds the NICs' link-up already" in said
