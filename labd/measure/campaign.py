"""Reconfiguration-latency campaigns, run through the daemon's public API (so a script, the
TUI and ``labd measure`` all measure the same way).

A campaign uses only a switch's free ports (those in no circuit) and leaves the switch as
it found it, also when it is interrupted. Patterns:

- ``toggle``: one pair, made then broken, over and over (each change is one row);
- ``random``: ``k`` random pairs made together, then broken together;
- ``permutation``: a new random matching of every free ingress to a free egress each time,
  replacing the last one (the whole free part of the map moves at once);
- ``sweep``: ``random`` for k = 1, 2, 4, … up to every free pair (the largest batch last).

Every row is the daemon's record of one reconfiguration (its phases in monotonic ns: requested,
dispatched, activated, acknowledged, light, done) plus the pattern and batch size.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

from labd.client.api import DaemonClient
from labd.errors import CampaignError
from labd.vocabulary import SPANS, percentile, span_ms

PATTERNS = ("toggle", "random", "permutation", "sweep")
#: Phase spans reported, each (name, from phase, to phase).


@dataclass(frozen=True)
class ReconfigPlan:
    switch: str
    pattern: str = "toggle"
    rounds: int = 20
    """Reconfigurations to record (per batch size, for a sweep)."""
    k: int = 1
    """Pairs per batch for ``random``."""
    verify_light: bool = True
    seed: int | None = None

    def check(self) -> None:
        if self.pattern not in PATTERNS:
            raise CampaignError(f"pattern {self.pattern!r}: expected one of "
                                f"{', '.join(PATTERNS)}")
        if self.rounds < 1:
            raise CampaignError(f"rounds {self.rounds}: need at least 1")
        if self.k < 1:
            raise CampaignError(f"k {self.k}: need at least 1 pair per batch")


@dataclass
class FreePorts:
    ingress: list[int]
    egress: list[int]
    kept: dict[int, int]
    """The circuits already on the switch (a permutation keeps them)."""


async def free_ports(client: DaemonClient, switch: str) -> FreePorts:
    state = await client.get(f"/v1/switches/{switch}")
    if not state.get("size"):
        raise CampaignError(f"switch {switch} is offline (not identified); nothing measured")
    used = {p for pair in state["intended"] for p in pair}
    kept = {a: b for a, b in state["intended"]}
    n, _, m = str(state["size"]).lower().partition("x")
    if not m:  # any-to-any: the free ports' first half to their second
        free = [p for p in range(1, int(n) + 1) if p not in used]
        return FreePorts(free[:len(free) // 2], free[len(free) // 2:], kept)
    top = int(n)
    return FreePorts([p for p in range(1, top + 1) if p not in used],
                     [p for p in range(top + 1, top + int(m) + 1) if p not in used], kept)


def batch_sizes(plan: ReconfigPlan, free: FreePorts) -> list[int]:
    most = min(len(free.ingress), len(free.egress))
    if most < 1:
        raise CampaignError(f"switch {plan.switch} has no free ingress/egress pair to measure "
                            "with; break a circuit first")
    if plan.pattern == "sweep":
        sizes = [1 << i for i in range(most.bit_length()) if 1 << i <= most]
        return sizes if sizes[-1] == most else [*sizes, most]
    if plan.pattern == "random" and plan.k > most:
        raise CampaignError(f"k {plan.k}: switch {plan.switch} has only {most} free pairs")
    return [{"toggle": 1, "random": plan.k}.get(plan.pattern, most)]


def planned(plan: ReconfigPlan, sizes: list[int]) -> int:
    """How many reconfigurations the campaign will record."""
    return plan.rounds * len(sizes)


async def run_reconfig(client: DaemonClient, plan: ReconfigPlan,
                       skip: int = 0) -> AsyncGenerator[dict[str, Any], None]:
    """Run the campaign; yield one row per reconfiguration as the daemon answers. ``skip``
    rows already measured (a resumed campaign) are not run again. The switch's free ports
    are left free afterwards, also when the caller stops early (close the generator:
    ``async with contextlib.aclosing(run_reconfig(...)) as rows``)."""
    plan.check()
    free = await free_ports(client, plan.switch)
    sizes = batch_sizes(plan, free)
    rng = random.Random(plan.seed)
    made: dict[int, int] = {}
    on_switch: dict[int, int] = {}
    base = {"verify_light": plan.verify_light, "cause": "measurement"}
    path = f"/v1/switches/{plan.switch}"
    try:
        index = 0
        body: dict[str, Any]
        for k in sizes:
            if made and plan.pattern != "permutation":
                # The last batch size ended on a make: break it before the next size (a
                # clean-up, not a row of the campaign).
                if on_switch:
                    await client.request("POST", f"{path}/disconnect",
                                         {**base, "ports": sorted(on_switch)})
                made = on_switch = {}
            pairs = list(zip(rng.sample(free.ingress, k), rng.sample(free.egress, k),
                             strict=True))
            for round_ in range(plan.rounds):
                # The same random draws whether a step is run or skipped: a resumed
                # campaign goes on exactly where the interrupted one stopped.
                if plan.pattern == "permutation":
                    pairs = list(zip(free.ingress[:k], rng.sample(free.egress, k), strict=True))
                    method, step, body = "PUT", "connections", {
                        "pairs": [*free.kept.items(), *pairs]}
                    made = dict(pairs)
                elif made:  # break what the last step made
                    method, step, body = "POST", "disconnect", {"ports": sorted(made)}
                    made = {}
                else:
                    if plan.pattern != "toggle":
                        pairs = list(zip(rng.sample(free.ingress, k),
                                         rng.sample(free.egress, k), strict=True))
                    method, step, body = "POST", "connections", {"pairs": pairs}
                    made = dict(pairs)
                if index >= skip:
                    if step == "disconnect" and not on_switch:  # resumed on a break
                        await client.request("POST", f"{path}/connections",
                                             {**base, "pairs": list(body_pairs(body, pairs))})
                    row = await client.request(method, f"{path}/{step}", {**base, **body})
                    on_switch = dict(made)
                    yield {**row, "pattern": plan.pattern, "k": k, "round": round_}
                index += 1
    finally:
        if on_switch:  # leave the free ports free
            await client.request("POST", f"{path}/disconnect",
                                 {**base, "ports": sorted(on_switch)})


def body_pairs(body: dict[str, Any], pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The pairs a break step takes down (to make them first when a campaign resumes)."""
    ports = set(body["ports"])
    return [p for p in pairs if p[0] in ports]


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per switch, batch size and span: n, p50, p90, p99, max (ms) over the ok rows."""
    groups: dict[tuple[str, int, str], list[float]] = {}
    for row in rows:
        if row.get("outcome") != "ok":
            continue
        for name, start, end in SPANS:
            value = span_ms(row, start, end)
            if value is not None:
                groups.setdefault((str(row["switch"]), int(row["k"]), name), []).append(value)
    return [{"switch": s, "k": k, "span": name, "n": len(v), "p50": percentile(v, 50),
             "p90": percentile(v, 90), "p99": percentile(v, 99), "max": max(v)}
            for (s, k, name), v in sorted(groups.items())]
