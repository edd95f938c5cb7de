"""Reconfiguration campaigns through the API, against a daemon on an emulated lab."""

from contextlib import aclosing

import pytest

from labd.client.api import DaemonClient
from labd.errors import CampaignError
from labd.measure.campaign import FreePorts, ReconfigPlan, batch_sizes, run_reconfig, summary
from tests.labs import switch
from tests.rigs import StartRig


def test_plans_are_checked_and_sweeps_reach_every_free_pair() -> None:
    free = FreePorts([1, 2, 3, 4, 5, 6], [9, 10, 11, 12, 13, 14], {})
    assert batch_sizes(ReconfigPlan("s", "sweep"), free) == [1, 2, 4, 6]
    assert batch_sizes(ReconfigPlan("s", "sweep"), FreePorts([1, 2], [9, 10], {})) == [1, 2]
    assert batch_sizes(ReconfigPlan("s", "permutation"), free) == [6]
    assert batch_sizes(ReconfigPlan("s", "random", k=3), free) == [3]
    for plan, words in ((ReconfigPlan("s", "zigzag"), "pattern 'zigzag'"),
                        (ReconfigPlan("s", rounds=0), "rounds 0"),
                        (ReconfigPlan("s", "random", k=0), "k 0")):
        with pytest.raises(CampaignError, match=words):
            plan.check()
    with pytest.raises(CampaignError, match="only 6 free pairs"):
        batch_sizes(ReconfigPlan("s", "random", k=7), free)
    with pytest.raises(CampaignError, match="no free ingress/egress pair"):
        batch_sizes(ReconfigPlan("s"), FreePorts([1], [], {}))


async def test_a_campaign_uses_free_ports_leaves_them_free_and_resumes(
        start_rig: StartRig) -> None:
    async with start_rig("camp", switch(switch_ms=1), token="t") as rig:
        engine = rig.daemon.engine
        await engine.reconfigure("ocs1", connect=[(1, 9)])  # someone's circuit
        client = DaemonClient(rig.daemon.url, "t")
        try:
            plan = ReconfigPlan("ocs1", "random", rounds=6, k=2, seed=5)
            rows = [row async for row in run_reconfig(client, plan)]
            assert engine.intended["ocs1"] == {1: 9}  # as it was found
            assert len(rows) == 6 and {r["cause"] for r in rows} == {"measurement"}
            made = [sorted(r["connected"]) for r in rows[::2]]
            broken = [sorted(r["disconnected"]) for r in rows[1::2]]
            assert made == broken and all(len(m) == 2 for m in made)
            assert not any(1 in pair or 9 in pair for m in made for pair in m)
            # Stopped after three rows, then resumed: the same pairs, in the same order.
            first = []
            async with aclosing(run_reconfig(client, plan)) as campaign:
                async for row in campaign:
                    first.append(row)
                    if len(first) == 3:
                        break  # an interruption mid-way: the made pairs are broken again
            assert engine.intended["ocs1"] == {1: 9}
            rest = [row async for row in run_reconfig(client, plan, skip=3)]
            assert [sorted(r["connected"] or r["disconnected"]) for r in first + rest] == [
                sorted(r["connected"] or r["disconnected"]) for r in rows]
            assert engine.intended["ocs1"] == {1: 9}
            table = summary(rows)
            device = next(r for r in table if r["span"] == "device")
            assert device["n"] == 6 and device["k"] == 2 and device["p50"] >= 1.0
            # A sweep with an odd number of rounds: each batch size's rows are its own.
            sweep = [row async for row in run_reconfig(
                client, ReconfigPlan("ocs1", "sweep", rounds=3, seed=2))]
            assert [r["k"] for r in sweep] == [1] * 3 + [2] * 3 + [4] * 3 + [7] * 3  # 7 free
            for row in sweep:
                assert len(row["connected"] or row["disconnected"]) == row["k"]
            assert engine.intended["ocs1"] == {1: 9}
            # A permutation keeps the circuit that was there and moves all the free ports.
            perm = [row async for row in run_reconfig(
                client, ReconfigPlan("ocs1", "permutation", rounds=2, seed=1))]
            assert all(len(r["connected"]) >= 6 for r in perm[:1])
            assert engine.intended["ocs1"] == {1: 9}
        finally:
            await client.close()


def test_the_model_check_compares_percentiles_and_each_change() -> None:
    from rich.console import Console

    from labd.measure.reports import model_check

    def row(i: int, switching_ms: float, truth_ms: float, before_ms: float = 0.0) -> dict:
        # ``before_ms`` of provisioning (a CALIENT's ENT-CRS) before the command that moved
        # the light: in the device time, not in the switching time.
        start = i * 100_000_000
        activated = start + int(before_ms * 1e6)
        return {"switch": "s", "k": 1, "outcome": "ok", "truth_ms": truth_ms,
                "phases": {"requested": start, "dispatched": start, "activated": activated,
                           "acknowledged": activated + int(switching_ms * 1e6),
                           "light": None, "done": activated + int(switching_ms * 1e6)}}

    def verdict(rows: list[dict]) -> str:
        console = Console(width=200, record=True)
        console.print(model_check(rows, {"switch_time_ms": 10, "jitter_ms": 0,
                                         "switches": ["s"]}))
        line = next(x for x in console.export_text().splitlines() if x.startswith("│ s "))
        return line.split("│")[-2].strip()

    even = [row(i, 10.3, 10.0, before_ms=1.2) for i in range(100)]
    assert verdict(even) == "yes, yes"  # 0.3 over, the provisioning not counted
    # Two late replies: the p99 of each change's excess is over, the p99s are not apart.
    late = [*even[:98], row(98, 10.0, 8.5), row(99, 10.0, 8.5)]
    assert verdict(late) == "yes, NO"
    assert verdict([row(i, 11.5, 10.0) for i in range(100)]) == "NO, NO"
