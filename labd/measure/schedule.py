"""Parallelism schedules replayed on the fabric: does reconfiguration fit in the idle
windows between a training iteration's communication phases?

A schedule is a list of phases, each with its start and duration (the time its traffic
uses the network) within one iteration and the circuits it needs on each switch. Replaying
it, labd reconfigures the switches for each phase that needs a different configuration:
- on demand: when the phase is due (the reconfiguration is all exposed);
- speculatively: as soon as the previous phase's traffic ends, so the idle window before
  the phase (compute) hides what it can.
Each window is reported: its length, the reconfiguration's time, whether it was hidden, how
far it overran (the phase started late by that much; later phases shift with it), and per
iteration the time added to it.

Schedule files are TOML (see ``labd/measure/schedules/``); ``synthetic`` makes 3D-parallel ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from labd.client.api import DaemonClient
from labd.errors import ScheduleError
from labd.files import TomlError, read_toml
from labd.vocabulary import percentile


class Phase(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    start_ms: float = Field(ge=0, description="when the phase's traffic starts, in the iteration")
    duration_ms: float = Field(gt=0, description="how long its traffic uses the network")
    circuits: dict[str, list[tuple[int, int]]] = Field(
        description="switch → the pairs the phase needs (the rest of its ports free)")


class Schedule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    description: str = ""
    iteration_ms: float = Field(gt=0, description="one iteration; the phases repeat")
    phase: list[Phase] = Field(min_length=1)

    @model_validator(mode="after")
    def _ordered(self) -> Schedule:
        previous_end = 0.0
        for phase in self.phase:
            if phase.start_ms < previous_end - 1e-9:
                raise ValueError(f"phase {phase.name!r} starts at {phase.start_ms} ms, before "
                                 f"the previous phase ends ({previous_end} ms): phases are "
                                 "in order and do not overlap")
            previous_end = phase.start_ms + phase.duration_ms
        if previous_end > self.iteration_ms + 1e-9:
            raise ValueError(f"the last phase ends at {previous_end} ms, after the iteration "
                             f"({self.iteration_ms} ms)")
        return self

    def switches(self) -> list[str]:
        return sorted({s for p in self.phase for s in p.circuits})

    def ports(self, switch: str) -> set[int]:
        """Every port of ``switch`` some phase puts in a circuit."""
        return {port for p in self.phase for pair in p.circuits.get(switch, ())
                for port in pair}


def load_schedule(path: str | Path) -> Schedule:
    """Read and check a schedule file; ScheduleError names the file and the field."""
    source = Path(path)
    if not source.exists():
        packaged = Path(__file__).parent / "schedules" / f"{path}.toml"
        if not packaged.exists():
            raise ScheduleError(f"{path}: no such schedule file (packaged: "
                                f"{', '.join(p.stem for p in packaged.parent.glob('*.toml'))})")
        source = packaged
    try:
        data = read_toml(source)
        return Schedule.model_validate(data)
    except (OSError, TomlError) as exc:
        raise ScheduleError(f"{source}: {exc}") from None
    except ValidationError as exc:
        problems = [f"{source}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                    for e in exc.errors()]
        raise ScheduleError("\n".join(problems)) from None


def synthetic(*, pp: int, dp: int, tp: int, microbatches: int, layers: int, ingress: int,
              switch: str = "ocs1", compute_ms: float = 2.0, tp_ms: float = 1.0,
              pp_ms: float = 2.0, dp_ms: float = 10.0) -> Schedule:
    """A 3D-parallel iteration (GPipe-like): for each microbatch, forward through the
    pipeline stages — per stage and layer a tensor-parallel all-reduce on the TP rings —
    and a pipeline send to the next stage; then the same backwards; then the data-parallel
    gradient all-reduce. GPU g = (stage, replica, shard) is cabled to ingress port g+1 and
    egress port ingress+g+1 of ``switch``; each collective's configuration is a ring over
    its groups. Between phases the GPUs compute (``compute_ms``): the idle windows."""
    gpus = pp * dp * tp
    if min(pp, dp, tp, microbatches, layers) < 1:
        raise ScheduleError("pp, dp, tp, microbatches and layers must each be at least 1")
    if gpus > ingress:
        raise ScheduleError(f"{pp}x{dp}x{tp} = {gpus} GPUs need {gpus} ports on each side of "
                            f"{switch}; it has {ingress}")

    def gpu(stage: int, replica: int, shard: int) -> int:
        return (stage * dp + replica) * tp + shard

    def ring(groups: list[list[int]]) -> list[tuple[int, int]]:
        return sorted((g + 1, ingress + group[(i + 1) % len(group)] + 1)
                      for group in groups if len(group) > 1 for i, g in enumerate(group))

    tp_ring = ring([[gpu(s, r, t) for t in range(tp)] for s in range(pp) for r in range(dp)])
    dp_ring = ring([[gpu(s, r, t) for r in range(dp)] for s in range(pp) for t in range(tp)])
    forward = sorted((gpu(s, r, t) + 1, ingress + gpu(s + 1, r, t) + 1)
                     for s in range(pp - 1) for r in range(dp) for t in range(tp))
    backward = sorted((gpu(s + 1, r, t) + 1, ingress + gpu(s, r, t) + 1)
                      for s in range(pp - 1) for r in range(dp) for t in range(tp))
    phases: list[Phase] = []
    clock = 0.0

    def add(name: str, circuits: list[tuple[int, int]], ms: float) -> None:
        nonlocal clock
        if not circuits:
            return
        clock += compute_ms  # the GPUs compute, the network idles
        phases.append(Phase(name=name, start_ms=round(clock, 3), duration_ms=ms,
                            circuits={switch: circuits}))
        clock += ms

    for direction, send in (("fwd", forward), ("bwd", backward)):
        for m in range(microbatches):
            for stage in range(pp):
                for layer in range(layers):
                    add(f"{direction} mb{m} stage{stage} layer{layer} tp", tp_ring, tp_ms)
                if stage < pp - 1:
                    add(f"{direction} mb{m} stage{stage} pp", send, pp_ms)
    add("dp all-reduce", dp_ring, dp_ms)
    if not phases:
        raise ScheduleError("this parallelism has no communication to schedule "
                            "(pp = dp = tp = 1)")
    return Schedule(name=f"3d-pp{pp}-dp{dp}-tp{tp}-mb{microbatches}-l{layers}",
                    description=f"synthetic 3D-parallel iteration: PP {pp}, DP {dp}, TP {tp}, "
                                f"{microbatches} microbatches, {layers} layers per stage, "
                                f"{compute_ms} ms compute between phases",
                    iteration_ms=round(clock + compute_ms, 3), phase=phases)


def to_toml(schedule: Schedule) -> str:
    """The schedule as a file, one line per switch's circuits (TOML)."""
    lines = [f"name = {json.dumps(schedule.name)}",
             f"description = {json.dumps(schedule.description)}",
             f"iteration_ms = {schedule.iteration_ms}"]
    for phase in schedule.phase:
        lines += ["", "[[phase]]", f"name = {json.dumps(phase.name)}",
                  f"start_ms = {phase.start_ms}", f"duration_ms = {phase.duration_ms}"]
        lines += [f"circuits.{switch} = {json.dumps([list(p) for p in pairs])}"
                  for switch, pairs in sorted(phase.circuits.items())]
    return "\n".join(lines) + "\n"


def idle_gaps(schedule: Schedule) -> list[float]:
    """Each phase's idle window in the schedule: from the end of the phase before (the
    previous iteration's last, for the first) to its start, in ms."""
    ends = [p.start_ms + p.duration_ms for p in schedule.phase]
    last = ends[-1] - schedule.iteration_ms
    return [p.start_ms - (ends[i - 1] if i else last) for i, p in enumerate(schedule.phase)]


async def check_switches(client: DaemonClient, schedule: Schedule
                         ) -> dict[str, dict[int, int]]:
    """A replay owns the ports its schedule uses: refuse a switch holding circuits on
    them. Returns, per switch, the circuits it holds on other ports (a replay keeps them)."""
    keep: dict[str, dict[int, int]] = {}
    for switch in schedule.switches():
        state = await client.get(f"/v1/switches/{switch}")
        used = schedule.ports(switch)
        clash = [pair for pair in state["intended"] if used & set(pair)]
        if clash:
            raise ScheduleError(
                f"switch {switch} holds circuits {clash[:4]}{'…' if len(clash) > 4 else ''} "
                "on ports the schedule uses: break them first")
        keep[switch] = {a: b for a, b in state["intended"]}
    return keep


#: The end of a wait a loop timer is not trusted with (s): uvloop rounds a timer to the
#: millisecond and its clock is read once per pass of the loop, so a timer fires up to a
#: millisecond early or late; the last stretch of a wait yields to the loop instead.
_TIMER_SLACK = 0.0007


async def sleep_until(deadline: float) -> None:
    """Wait until ``time.monotonic()`` reaches ``deadline``: on a timer for all but its
    last :data:`_TIMER_SLACK`, then yielding to the loop (a window of 8 ms is what is
    measured: a millisecond of the timer's is an eighth of it)."""
    while (left := deadline - time.monotonic()) > 0:  # noqa: ASYNC110 - a clock, not a state
        await asyncio.sleep(left - _TIMER_SLACK if left > 2 * _TIMER_SLACK else 0)


_DONE = object()


async def replay(client: DaemonClient, schedule: Schedule, *, iterations: int,
                 speculative: bool, skip: int = 0) -> AsyncIterator[dict[str, Any]]:
    """Replay ``iterations`` iterations in real time; yield one row per phase (its window
    and reconfiguration). ``skip`` rows already measured are not measured again (a resumed
    run replays the interrupted iteration from its start but keeps only the phases it
    lacks). Circuits the switches hold on ports the schedule does not use stay as they are;
    what the replay made is cleared afterwards.

    The replay keeps its own time in a task of its own: whoever takes the rows (a run
    commits each to its store) does so meanwhile, not inside the next idle window."""
    if iterations < 1:
        raise ScheduleError(f"iterations {iterations}: need at least 1")
    keep = await check_switches(client, schedule)
    config: dict[str, dict[int, int]] = {s: {} for s in schedule.switches()}
    rows: asyncio.Queue[Any] = asyncio.Queue()

    async def timed() -> None:
        try:
            await _replay_timed(client, schedule, keep, config, rows.put_nowait,
                                iterations=iterations, speculative=speculative, skip=skip)
        except BaseException as exc:
            rows.put_nowait(exc)  # raised where the rows are taken
            if isinstance(exc, asyncio.CancelledError):
                raise
            return
        rows.put_nowait(_DONE)

    # A full collection walks every object of the process: with the daemon in this process
    # (``--lab``) one took ~90 ms, in the middle of a window, every few seconds. What lives
    # before the replay is left out of collections until it ends.
    gc.freeze()
    replaying = asyncio.create_task(timed(), name=f"replay {schedule.name}")
    try:
        while (row := await rows.get()) is not _DONE:
            if isinstance(row, BaseException):
                raise row
            yield row
    finally:
        if not replaying.done():
            replaying.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await replaying
        gc.unfreeze()
        for switch, pairs in config.items():
            if pairs:
                await client.post(f"/v1/switches/{switch}/disconnect", {
                    "ports": sorted(pairs), "verify_light": False, "cause": "schedule"})


async def _replay_timed(client: DaemonClient, schedule: Schedule,
                        keep: dict[str, dict[int, int]], config: dict[str, dict[int, int]],
                        emit: Callable[[dict[str, Any]], None], *, iterations: int,
                        speculative: bool, skip: int) -> None:
    """The replay's timeline (see :func:`replay`); ``config`` follows what each switch was
    given, ``emit`` takes each row."""
    per_iteration = len(schedule.phase)
    first = skip // per_iteration
    mode = "speculative" if speculative else "on demand"

    async def reconfigure(phase: Phase) -> tuple[float, list[str], float | None]:
        """Put the phase's configuration on every switch that lacks it: (when the last
        answer came, switches changed, the daemon's longest requested → done in ms)."""
        changed = [s for s, pairs in phase.circuits.items() if dict(pairs) != config[s]]
        answers = await asyncio.gather(*(
            client.put(f"/v1/switches/{s}/connections", {
                "pairs": [*map(list, keep[s].items()), *map(list, phase.circuits[s])],
                "verify_light": False, "cause": "schedule"}) for s in changed))
        answered = time.monotonic()
        for s in changed:
            config[s] = dict(phase.circuits[s])
        spans = [(a["phases"]["done"] - a["phases"]["requested"]) / 1e6 for a in answers
                 if a.get("phases", {}).get("done") and a["phases"].get("requested")]
        bad = [a for a in answers if a.get("outcome") != "ok"]
        if bad:
            raise ScheduleError(f"phase {phase.name!r}: {bad[0]['switch']}: {bad[0]['error']}")
        return answered, changed, max(spans, default=None)

    gaps = idle_gaps(schedule)
    origin = time.monotonic()  # when the current iteration began
    # When the last phase's traffic ended. Before the first, nothing uses the switches: a
    # speculative replay reconfigures for it at once.
    previous_end: float | None = origin if speculative else None
    for iteration in range(first, iterations):
        late = 0.0  # how far behind the schedule this iteration runs (s)
        for index, phase in enumerate(schedule.phase):
            due = origin + phase.start_ms / 1000 + late
            if previous_end is not None:
                begin = previous_end  # at once: the traffic before has ended
            else:
                await sleep_until(due)
                begin = time.monotonic()
            # Timed from when the request left (a speculative one leaves at once, but not
            # before the loop comes back to the replay), not from when it was due to.
            sent = time.monotonic()
            ready, changed, device_ms = await reconfigure(phase)
            overrun = max(0.0, ready - due)
            late += overrun
            start = max(due, ready)
            if iteration * per_iteration + index >= skip:
                # Handed over now, so that taking it (a run commits it) overlaps the rest
                # of the window and the phase's traffic, not the next reconfiguration.
                emit({"iteration": iteration, "phase": index, "name": phase.name,
                      "mode": mode, "changed": changed, "gap_ms": gaps[index],
                      "window_ms": max(0.0, due - begin) * 1000,
                      "reconfig_ms": (ready - sent) * 1000 if changed else 0.0,
                      "daemon_ms": device_ms, "hidden": overrun == 0.0,
                      "overrun_ms": overrun * 1000, "late_ms": late * 1000})
            await sleep_until(start)
            # The phase's traffic; the GPUs then compute until the next phase. Its end is
            # the schedule's (not when this task next ran): the idle window starts there.
            end = start + phase.duration_ms / 1000
            await sleep_until(end)
            if speculative:
                previous_end = end
        origin += schedule.iteration_ms / 1000 + late


def schedule_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode: windows that needed a change, the share hidden, overruns and the time
    added per iteration."""
    out = []
    for mode in sorted({r["mode"] for r in rows}):
        mine = [r for r in rows if r["mode"] == mode]
        needing = [r for r in mine if r["changed"]]
        iterations: dict[int, float] = {}
        for r in mine:
            iterations[r["iteration"]] = iterations.get(r["iteration"], 0.0) + r["overrun_ms"]
        added = list(iterations.values())
        over = [r["overrun_ms"] for r in needing]
        out.append({
            "mode": mode, "iterations": len(iterations), "windows": len(needing),
            "hidden": sum(1 for r in needing if r["hidden"]) / len(needing) if needing else 1.0,
            "reconfig_p50": percentile([r["reconfig_ms"] for r in needing], 50),
            "window_p50": percentile([r["window_ms"] for r in needing], 50),
            "overrun_p50": percentile(over, 50), "overrun_p99": percentile(over, 99),
            "added_per_iteration": sum(added) / len(added) if added else 0.0})
    return out
