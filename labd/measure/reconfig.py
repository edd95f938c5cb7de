"""Reconfiguration campaigns, ``labd measure reconfig``: measured against a daemon and kept
as named runs (labd.measure.runs; their reports in labd.measure.reports).

A campaign runs against a daemon (``--url``) or a lab file (``--lab``: its emulated
instruments and a daemon on them are started here, and every row gets the emulator's ground
truth beside it: when the command arrived and when the light settled).
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from instruments.errors import InstrumentError
from labd import __version__
from labd.client.api import DaemonClient
from labd.client.control import Backdoor
from labd.errors import BackdoorError, CampaignError, LabdError, RunError
from labd.lab.loader import file_sha256, load_lab, resolve_lab_path
from labd.measure.campaign import ReconfigPlan, batch_sizes, free_ports, run_reconfig
from labd.measure.figures import conditions, figure_values, summarise, switch_label
from labd.measure.reports import (
    check_model,
    compare_schedules,
    compare_table,
    export,
    failures,
    model_check,
    summary_table,
)
from labd.measure.runs import Run, RunStore
from labd.vocabulary import PHASES

# The reports and figures live in labd.measure.reports and labd.measure.figures; the measure
# commands import them from here too.
__all__ = [
    "DEFAULT_URL", "Measured", "Target", "apply_timing", "attach_truth", "check_model",
    "compare_schedules", "compare_table", "conditions", "default_name", "export", "failures",
    "figure_values", "finishing", "keep", "model_check", "new_run", "open_target", "params_of",
    "plan_campaign", "plans_from", "progress_bar", "resume_run", "resume_target",
    "run_campaign", "slim", "summarise", "summary_table", "switch_label", "switch_models",
    "switches_of",
]


@dataclass
class Measured:
    """What a run was measured on: the lab's name, its file's SHA-256, and where."""

    lab_name: str
    lab_sha256: str
    where: str


@dataclass
class Target(Measured):
    client: DaemonClient = field(kw_only=True)
    backdoor: Backdoor | None = field(default=None, kw_only=True)
    """The emulators' control endpoint, where the lab is emulated here (ground truth)."""
    spec: dict[str, str | None] = field(default_factory=dict, kw_only=True)
    """How to reach it again: ``{"lab": file}``, or ``{"url": …, "control": …}``; a run
    keeps it (``params["target"]``) so that ``--resume`` goes on where the run began."""


#: The daemon a campaign measures when neither ``--url`` nor ``--lab`` is given.
DEFAULT_URL = "http://127.0.0.1:8470"


def resume_target(run: Run, *, lab: str | None, url: str | None, control: str | None
                  ) -> dict[str, str | None]:
    """Where an interrupted run goes on: where it began. A lab, daemon or control endpoint
    named on the command line that differs from the run's is refused, since the rows of
    one run must come from one target."""
    kept = dict(run.params.get("target") or _target_of(run.target))
    for option, given in (("lab", lab), ("url", url), ("control", control)):
        if given is None:
            continue
        if option not in kept and option == "control" and "url" in kept:
            kept["control"] = given  # kept before runs said: the user's word for it
        elif not _same(option, kept.get(option), given):
            raise RunError(f"run {run.name!r} was measured on {run.target}; --resume goes "
                           f"on there: leave out --{option} {given}")
    return kept


def _same(option: str, kept: str | None, given: str) -> bool:
    if kept is None:
        return False
    if option != "lab":
        return kept.rstrip("/") == given.rstrip("/")
    try:
        return resolve_lab_path(given).resolve() == Path(kept).resolve()
    except LabdError:
        return False


def _lab_spec(source: str) -> dict[str, str | None]:
    return {"lab": str(Path(source).resolve())}


def _target_of(where: str) -> dict[str, str | None]:
    """The target of a run kept before runs kept their ``params["target"]``."""
    if where.startswith("lab ") and where.endswith(" (emulated)"):
        return {"lab": where[len("lab "):-len(" (emulated)")]}
    return {"url": where}  # its control endpoint, if any, was not kept


@contextlib.asynccontextmanager
async def open_target(*, lab: str | None, url: str, token: str | None,
                      control: str | None = None) -> AsyncIterator[Target]:
    """The daemon to measure: one at ``url`` (with ``control``, the control endpoint of the
    emulators it drives, for ground truth), or one started here on ``lab`` in emulation."""
    if lab is None:
        client = DaemonClient(url, token)
        backdoor = Backdoor(control) if control else None
        try:
            health = await client.get("/v1/health")
            yield Target(health["lab"], health.get("lab_sha256", ""), url, client=client,
                         backdoor=backdoor, spec={"url": url, "control": control})
        finally:
            await client.close()
            if backdoor is not None:
                await backdoor.close()
        return
    from labd.emulation.rig import emulated_rig

    loaded = load_lab(lab)
    # The emulators in a process of their own (as the hardware would be): the daemon's
    # numbers are then not shared with the devices' own work on one event loop.
    with tempfile.TemporaryDirectory() as scratch:
        async with emulated_rig(loaded, db=str(Path(scratch) / "measure.sqlite"),
                                token="measure", apart=True, hosts=False) as rig:
            client = DaemonClient(rig.daemon.url, "measure")
            try:
                yield Target(loaded.lab.name, file_sha256(loaded.source),
                             f"lab {loaded.source} (emulated)", client=client,
                             backdoor=rig.backdoor,
                             spec=_lab_spec(loaded.source))
            finally:
                await client.close()


def slim(row: dict[str, Any]) -> dict[str, Any]:
    """What a run keeps of one reconfiguration."""
    phases = row.get("phases") or {}
    return {"switch": row["switch"], "pattern": row["pattern"], "k": row["k"],
            "round": row["round"], "id": row.get("id"), "outcome": row.get("outcome"),
            "error": row.get("error"), "cause": row.get("cause"),
            "pairs": len(row.get("connected") or []) + len(row.get("disconnected") or []),
            "phases": {p: phases.get(p) for p in PHASES}}



async def attach_truth(backdoor: Backdoor, row: dict[str, Any], seen: dict[str, int]) -> None:
    """The emulator's record of the change this row made: from the command's arrival to
    the last mirror settling (``truth_ms``)."""
    switch = row["switch"]
    changes = (await backdoor.truth(switch, seen.get(switch, 0)))["changes"]
    if changes:
        seen[switch] = changes[-1]["seq"]
    phases = row["phases"]
    start, end = phases.get("dispatched"), phases.get("acknowledged")
    if start is None or end is None:
        return
    mine = [c for c in changes if start <= c["arrived_ns"] <= end and c["op"] != "port"]
    if mine:
        row["truth_ms"] = (max(c["settled_ns"] for c in mine)
                           - min(c["arrived_ns"] for c in mine)) / 1e6


async def switches_of(client: DaemonClient) -> list[str]:
    instruments = await client.get("/v1/instruments")
    return [i["id"] for i in instruments if i.get("kind", "switch") == "switch"]


async def switch_models(client: DaemonClient, switches: list[str]) -> dict[str, str]:
    """Each switch's make and model as it identified itself (its driver where it has not),
    kept with a run so that its reports and plots say what was measured."""
    models = {}
    for entry in await client.get("/v1/instruments"):
        if entry["id"] in switches:
            identity = entry.get("identity") or {}
            made = " ".join(p for p in (identity.get("vendor"), identity.get("model")) if p)
            models[entry["id"]] = made or entry.get("driver") or "switch"
    return models



def progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeRemainingColumn(), console=console, transient=True)


async def keep(store: RunStore, run: Run, rows: list[dict[str, Any]],
               source: AsyncIterator[dict[str, Any]], progress: Progress, task: Any,
               then: Callable[[dict[str, Any]], Any] | None = None) -> None:
    """Measure from ``source``, committing each row to the run as it comes (after
    ``then(row)`` adds what it adds)."""
    async with aclosing(source) as measuring:  # type: ignore[type-var]
        async for row in measuring:
            if then is not None:
                await then(row)
            await asyncio.to_thread(store.add, run, row)
            rows.append(row)
            progress.advance(task)


async def run_campaign(target: Target, plans: list[ReconfigPlan], store: RunStore, run: Run,
                       console: Console, done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Measure what ``plans`` ask for beyond the rows already ``done`` (a resumed run),
    keeping each row in the run as it comes."""
    rows = list(done)
    per_switch = Counter(r["switch"] for r in rows)
    seen: dict[str, int] = {}
    backdoor = target.backdoor
    truth_of = None if backdoor is None else partial(attach_truth, backdoor, seen=seen)
    with progress_bar(console) as progress:
        task = progress.add_task(f"run {run.name}", total=run.planned, completed=len(rows))
        for plan in plans:
            if target.backdoor is not None:  # only the changes from here on
                truth = await target.backdoor.truth(plan.switch)
                seen[plan.switch] = truth["changes"][-1]["seq"] if truth["changes"] else 0
            progress.update(task, description=f"{plan.switch} {plan.pattern}")

            async def slimmed(plan: ReconfigPlan = plan) -> AsyncIterator[dict[str, Any]]:
                async with aclosing(run_reconfig(target.client, plan,
                                                 skip=per_switch[plan.switch])) as answers:
                    async for answer in answers:
                        yield slim(answer)

            await keep(store, run, rows, slimmed(), progress, task, truth_of)
    return rows


async def plan_campaign(target: Target, switches: list[str] | None, pattern: str,
                        rounds: int, k: int, verify_light: bool, seed: int
                        ) -> tuple[list[ReconfigPlan], int]:
    """One plan per switch (each checked against the switch's free ports before anything
    is sent) and how many rows they will measure."""
    names = switches or await switches_of(target.client)
    plans, planned = [], 0
    for i, switch in enumerate(names):
        plan = ReconfigPlan(switch, pattern, rounds, k, verify_light, seed + i)
        plan.check()
        planned += rounds * len(batch_sizes(plan, await free_ports(target.client, switch)))
        plans.append(plan)
    return plans, planned


def default_name(kind: str) -> str:
    return f"{kind}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"


def params_of(plans: list[ReconfigPlan]) -> dict[str, Any]:
    first = plans[0]
    return {"switches": [p.switch for p in plans], "pattern": first.pattern,
            "rounds": first.rounds, "k": first.k, "verify_light": first.verify_light,
            "seed": first.seed}


def plans_from(params: dict[str, Any]) -> list[ReconfigPlan]:
    """The plans of a stored run (a resumed run measures exactly what it was asked to)."""
    return [ReconfigPlan(s, params["pattern"], params["rounds"], params["k"],
                         params["verify_light"], params["seed"] + i)
            for i, s in enumerate(params["switches"])]


def new_run(store: RunStore, *, name: str | None, kind: str, params: dict[str, Any],
            target: Measured, planned: int) -> Run:
    if isinstance(target, Target):
        params = {**params, "target": target.spec}
    return store.create(name=name or default_name(kind), kind=kind, params=params,
                        labd_version=__version__, target=target.where,
                        lab_name=target.lab_name, lab_sha256=target.lab_sha256,
                        planned=planned)


def resume_run(store: RunStore, name: str, kind: str, target: Measured, console: Console
               ) -> tuple[Run, list[dict[str, Any]]]:
    """An interrupted run to go on with, and the rows it holds."""
    measured = store.get(name)
    if measured.kind != kind:
        raise LabdError(f"run {name!r} is a {measured.kind} run, not a {kind} run")
    if measured.status == "complete":
        raise LabdError(f"run {name!r} is complete; nothing to resume")
    if measured.lab_name != target.lab_name:
        raise RunError(f"{target.where} runs lab {target.lab_name!r}, and run {name!r} was "
                       f"measured on lab {measured.lab_name!r}: another daemon; start the "
                       "run's own lab's daemon there, or begin a new run")
    if measured.lab_sha256 and measured.lab_sha256 != target.lab_sha256:
        console.print(f"[yellow]the lab file differs from the one run {name} began on[/]")
    store.reopen(measured)
    return measured, store.rows(measured)


@contextlib.asynccontextmanager
async def finishing(store: RunStore, run: Run) -> AsyncIterator[None]:
    """The run's status after the work inside: complete, interrupted (Ctrl-C; what was
    measured is kept) or failed (with why)."""
    try:
        yield
    except asyncio.CancelledError:
        store.finish(run, "interrupted")
        raise
    except (LabdError, InstrumentError) as exc:
        store.finish(run, "failed", str(exc))
        raise
    store.finish(run, "complete")


async def apply_timing(target: Target, switches: list[str], timing: dict[str, Any] | None,
                       console: Console, *, light: bool = False) -> None:
    """Set the emulated switches' timing model (lab mode); ``timing["switches"]`` says
    which took it (a mesh's time is its heaters' settling, not a setting). With ``light``
    (verification on), a model slower than a switch's light window is refused first."""
    if timing is None or target.backdoor is None:
        return
    model = {k: v for k, v in timing.items() if k != "switches"}
    # A mesh has no switching time to set (its time is its heaters' settling): asked, its
    # emulator would refuse; it is left out, said once.
    takes = [switch for switch in switches
             if (await target.backdoor.describe(switch)).get("timing") is not None]
    if left := [switch for switch in switches if switch not in takes]:
        console.print(f"  measured as set in the lab: {', '.join(left)} (no switching time "
                      "to set: the heaters' settling is the time)")
    if light:
        slowest = model["switch_time_ms"] + model["jitter_ms"]
        for switch in takes:
            state = await target.client.get(f"/v1/switches/{switch}")
            window = state["light_window_ms"]
            if state["metered_paths"] and slowest >= window:
                raise CampaignError(
                    f"--switch-ms {model['switch_time_ms']:g} (± {model['jitter_ms']:g}): "
                    f"{switch}'s light window is {window:g} ms, so every light verification "
                    "would time out; raise 'light_window_ms' in the lab file, or measure "
                    "with --no-light")
    timing["switches"] = []
    for switch in takes:
        try:
            await target.backdoor.set_timing(switch, **model)
            timing["switches"].append(switch)
        except BackdoorError as exc:
            console.print(f"  {switch}: measured as it is ({exc})")
