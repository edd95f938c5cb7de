"""Parallelism schedules: files, the synthetic 3D-parallel generator, and replays through
the API on an emulated lab."""

import random
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from labd.client.api import DaemonClient
from labd.errors import ScheduleError
from labd.measure.reports import compare_schedules
from labd.measure.runs import Run
from labd.measure.schedule import (
    check_switches,
    idle_gaps,
    load_schedule,
    replay,
    schedule_summary,
    synthetic,
    to_toml,
)
from labd.measure.stats import DASH
from tests.commands.test_cli import run
from tests.labs import switch
from tests.rigs import StartRig


def test_synthetic_3d_schedule_is_made_of_rings_and_pipeline_sends(tmp_path: Path) -> None:
    made = synthetic(pp=2, dp=2, tp=2, microbatches=4, layers=2, ingress=16, compute_ms=3)
    # forward and backward: per microbatch 2 stages x 2 layers of TP, 1 pipeline send
    assert len(made.phase) == 2 * 4 * (2 * 2 + 1) + 1
    for phase in made.phase:
        pairs = phase.circuits["ocs1"]
        ins, outs = [a for a, _ in pairs], [b for _, b in pairs]
        assert len(set(ins)) == len(ins) and len(set(outs)) == len(outs)  # a matching
        assert all(1 <= a <= 8 and 17 <= b <= 24 for a, b in pairs)  # 8 GPUs
    tp = made.phase[0].circuits["ocs1"]
    assert (1, 18) in tp and (2, 17) in tp  # GPUs 0 and 1 are one TP group: a ring of two
    send = next(p for p in made.phase if p.name.endswith(" pp")).circuits["ocs1"]
    assert (1, 16 + 4 + 1) in send  # stage 0 GPU 0 sends to stage 1 GPU 4
    assert made.phase[-1].name == "dp all-reduce"
    gaps = idle_gaps(made)
    assert all(g == pytest.approx(3) for g in gaps[1:]) and gaps[0] == pytest.approx(6)
    path = tmp_path / "s.toml"
    path.write_text(to_toml(made))
    assert load_schedule(path) == made
    with pytest.raises(ScheduleError, match="8 GPUs need 8 ports"):
        synthetic(pp=2, dp=2, tp=2, microbatches=1, layers=1, ingress=4)


def test_bad_schedule_files_name_the_file_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    for text, words in (
            ("name = 'x'\niteration_ms = 10\n", "phase: Field required"),
            ("name = 'x'\niteration_ms = 10\n[[phase]]\nname = 'a'\nstart_ms = 0\n"
             "duration_ms = 5\ncircuits.s = [[1, 2]]\n[[phase]]\nname = 'b'\nstart_ms = 3\n"
             "duration_ms = 1\ncircuits.s = [[1, 2]]\n", "phase 'b' starts at 3.0 ms"),
            ("name = 'x'\niteration_ms = 4\n[[phase]]\nname = 'a'\nstart_ms = 0\n"
             "duration_ms = 5\ncircuits.s = [[1, 2]]\n", "after the iteration"),
            ("name = [", "not valid TOML"),
            # Read by Python's int(), which refuses this many digits: one line, not a
            # traceback.
            ("iteration_ms = " + "9" * 5000 + "\n", "a value cannot be read"),
            ("x = " + "[" * 600 + "]" * 600 + "\n", "nest too deeply")):
        path.write_text(text)
        with pytest.raises(ScheduleError, match=words) as caught:
            load_schedule(path)
        assert str(path) in str(caught.value)
    with pytest.raises(ScheduleError, match=r"packaged: .*3d-small"):
        load_schedule("no-such-schedule")


async def test_a_replay_reconfigures_at_phase_changes_and_clears_after(
        start_rig: StartRig) -> None:
    plan = synthetic(pp=2, dp=1, tp=2, microbatches=1, layers=2, ingress=8, compute_ms=4,
                     tp_ms=1, pp_ms=1, dp_ms=1)
    async with start_rig("sched", switch(switch_ms=1), token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        try:
            await check_switches(client, plan)
            rows = [r async for r in replay(client, plan, iterations=2, speculative=True)]
            assert len(rows) == 2 * len(plan.phase)
            assert [(r["iteration"], r["phase"]) for r in rows[:3]] == [(0, 0), (0, 1), (0, 2)]
            # A phase needing what the one before had changes nothing; the rest change ocs1.
            for before, row in zip(plan.phase, plan.phase[1:], strict=False):
                same = before.circuits == row.circuits
                assert rows[plan.phase.index(row)]["changed"] == ([] if same else ["ocs1"])
            assert rows[0]["changed"] == ["ocs1"] and rows[0]["mode"] == "speculative"
            assert all(r["reconfig_ms"] == 0 for r in rows if not r["changed"])
            assert not rig.daemon.engine.intended["ocs1"]  # cleared afterwards
            recorded = await client.get("/v1/reconfigurations", cause="schedule", limit=1000)
            changes = sum(1 for r in rows if r["changed"])
            assert len(recorded) == changes + 1  # and one to clear the map
            (summary,) = schedule_summary(rows)
            assert summary["windows"] == changes and summary["iterations"] == 2
            # A resumed replay measures only the phases it lacks.
            rest = [r async for r in replay(client, plan, iterations=2, speculative=False,
                                            skip=len(plan.phase) + 2)]
            assert (rest[0]["iteration"], rest[0]["phase"]) == (1, 2)
            assert len(rest) == len(plan.phase) - 2 and rest[0]["mode"] == "on demand"
            # A circuit on ports the schedule does not use stays through a replay, untouched;
            # one on ports it uses is not taken over.
            assert plan.ports("ocs1") <= {1, 2, 3, 4, 9, 10, 11, 12}
            await rig.daemon.engine.reconfigure("ocs1", connect=[(7, 15)])
            assert await check_switches(client, plan) == {"ocs1": {7: 15}}
            seen = len(await client.get("/v1/reconfigurations", cause="schedule", limit=1000))
            rows = [r async for r in replay(client, plan, iterations=1, speculative=True)]
            assert rig.daemon.engine.intended["ocs1"] == {7: 15}
            after = (await client.get("/v1/reconfigurations", cause="schedule",
                                      limit=1000))[:-seen]
            assert len(after) == sum(1 for r in rows if r["changed"]) + 1
            assert all([7, 15] not in r["connected"] + r["disconnected"] for r in after)
            await rig.daemon.engine.reconfigure("ocs1", connect=[(3, 12)])
            with pytest.raises(ScheduleError, match=r"holds circuits \[\[3, 12\]\] on ports "
                                                    "the schedule uses"):
                await check_switches(client, plan)
        finally:
            await client.close()


async def test_schedule_command_refuses_bad_requests(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text("name = 1\n")
    for args, words in ((["3d-small", "--mode", "sometimes"], "--mode 'sometimes'"),
                        (["3d-small", "--iterations", "0"], "--iterations 0"),
                        ([str(tmp_path / "bad.toml"), "--lab", "demo"], "name: Input should"),
                        (["3d-small", "--switch-ms", "5"], "needs --lab")):
        code, out, err = await run("measure", "schedule", *args, "--runs",
                                   str(tmp_path / "r.sqlite"), timeout=60)
        assert code == 2 and words in " ".join((out + err).split()), (args, out, err)
        assert "Traceback" not in out + err


def replayed(seed: int, switch_ms: float, *, iterations: int = 100, window_ms: float = 27.0,
             mode: str = "on demand") -> list[dict[str, Any]]:
    """A replay's rows as a run keeps them, of a schedule with four phase changes per
    iteration, each reconfiguration taking about ``switch_ms`` (0.2 ms of spread) in a
    window of ``window_ms`` before its phase is due."""
    rng = random.Random(seed)
    rows = []
    for iteration in range(iterations):
        late = 0.0
        for phase in range(4):
            took = switch_ms + rng.gauss(0, 0.2)
            overrun = max(0.0, took - window_ms)
            late += overrun
            rows.append({"iteration": iteration, "phase": phase, "name": f"p{phase}",
                         "mode": mode, "changed": True, "gap_ms": window_ms,
                         "window_ms": window_ms, "reconfig_ms": took, "daemon_ms": took,
                         "hidden": overrun == 0.0, "overrun_ms": overrun, "late_ms": late})
    return rows


def schedule_run(name: str) -> Run:
    return Run(name=name, kind="schedule", labd_version="0", lab_name="bench",
               target="lab bench.toml (emulated)", lab_sha256="", planned=0,
               status="complete", params={"emulated": True})


def verdicts(a: str, rows_a: list[dict[str, Any]], b: str, rows_b: list[dict[str, Any]]
             ) -> dict[str, str]:
    """The comparison as printed: each figure's verdict, by figure."""
    console = Console(width=240, record=True)
    console.print(compare_schedules(schedule_run(a), rows_a, schedule_run(b), rows_b))
    out = console.export_text()
    assert "nan" not in out
    found = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) >= 7 and cells[1] == "on demand":
            found[cells[2]] = cells[6]
    return found


def test_compare_of_schedule_runs_tells_noise_from_a_slower_switch() -> None:
    # Two replays of the same configuration (25 ms switch, 27 ms windows): noise only.
    same = verdicts("a25", replayed(1, 25), "b25", replayed(2, 25))
    assert set(same) == {"hidden share", *(f"{figure} p{q}" for figure in (
        "reconfiguration", "overrun", "added per iteration") for q in (50, 99))}
    assert all(v.startswith("within noise") for v in same.values()), same

    # 30 ms against 25 ms: B is slower, its changes no longer hidden, and it says by how much.
    slower = verdicts("a25", replayed(1, 25), "c30", replayed(2, 30))
    assert 4.8 < by(slower["reconfiguration p50"], "c30 is slower") < 5.2
    assert 2.8 < by(slower["overrun p50"], "c30 is slower") < 3.2  # 30 ms in 27 ms windows
    assert 11 < by(slower["added per iteration p50"], "c30 is slower") < 13  # four a time
    assert slower["hidden share"].startswith("c30 is hidden less often by 100.0 points")
    # And the other way round, A against B: faster.
    faster = verdicts("c30", replayed(2, 30), "a25", replayed(1, 25))
    assert 4.8 < by(faster["reconfiguration p50"], "a25 is faster") < 5.2


def by(verdict: str, said: str) -> float:
    """How much a verdict says, checked to hold its interval in words."""
    found = re.fullmatch(rf"{said} by ([\d.]+) ms \(95 % CI ([\d.]+){DASH}([\d.]+)\)", verdict)
    assert found, verdict
    much, low, high = map(float, found.groups())
    assert low <= much <= high
    return much


def test_a_schedule_compare_says_what_cannot_be_compared() -> None:
    """A mode in one run only, and too few windows for a p99, in words (never nan)."""
    few = replayed(1, 25, iterations=5)  # 20 windows: a p50, not a p99
    speculative = replayed(3, 25, iterations=5, mode="speculative")
    console = Console(width=240, record=True)
    console.print(compare_schedules(schedule_run("a"), few, schedule_run("b"),
                                    few + speculative))
    out = console.export_text()
    assert "n = 20: too few for a p99 (needs 100)" in out
    assert "only in b" in out and "nan" not in out
