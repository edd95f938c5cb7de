"""Parallelism schedules: files, the synthetic 3D-parallel generator, and replays through
the API on an emulated lab."""

from pathlib import Path

import pytest

from labd.client.api import DaemonClient
from labd.errors import ScheduleError
from labd.measure.schedule import (
    check_switches,
    idle_gaps,
    load_schedule,
    replay,
    schedule_summary,
    synthetic,
    to_toml,
)
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
            ("name = [", "not TOML")):
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
