"""An availability run's report: the failures driven against those modelled, the rig's
recoveries, ETTR and GPU-hours lost per strategy and per class, the sweeps, and where each
number came from (measured on the rig, a model input and its source, or the user's).

Everything here is computed again from what the run keeps (its parameters, among them the
profile, and its rows), so ``labd measure show`` gives the same tables as the run did.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from rich.table import Table

from labd.errors import LabdError
from labd.lab.loader import Lab
from labd.measure.ettr import (
    MIXNET_LINK_UP_S,
    STANDBY_SHARE,
    STRATEGIES,
    STRATEGY_LABELS,
    SWEEPS,
    Estimate,
    ModelInputs,
    Outcome,
    Recoveries,
    simulate,
    sweep,
)
from labd.measure.failures import FailureClass, Profile, poisson_interval
from labd.measure.figures import conditions
from labd.measure.runs import Run
from labd.measure.stats import DASH, compare_values
from labd.vocabulary import percentile


def profile_params(profile: Profile) -> dict[str, Any]:
    """The profile as a run keeps it (a user's file may be gone when the run is read)."""
    return {"name": profile.name, "source": profile.source, "gpus": profile.gpus,
            "hours": profile.hours, "note": profile.note,
            "classes": [asdict(c) for c in profile.classes],
            "events": [list(e) for e in profile.events] if profile.events else None,
            "per_host": profile.per_host}


def profile_of(params: dict[str, Any]) -> Profile:
    p = params["profile"]
    return Profile(p["name"], p["source"], int(p["gpus"]), float(p["hours"]),
                   tuple(FailureClass(**c) for c in p["classes"]), p.get("note", ""),
                   tuple((float(h), str(c)) for h, c in p["events"]) if p.get("events")
                   else None, int(p.get("per_host", 8)))


def inputs_params(inputs: ModelInputs) -> dict[str, Any]:
    return asdict(inputs)


def inputs_of(params: dict[str, Any]) -> ModelInputs:
    return ModelInputs(**params["model"])


@dataclass(frozen=True)
class Model:
    """An availability run's model, computed from what it keeps."""

    profile: Profile
    inputs: ModelInputs
    recoveries: Recoveries
    outcome: Outcome
    sweeps: dict[str, list[tuple[float, Outcome]]]


#: The last model computed, by what it was computed from: the report and the plots of one
#: run ask for the same model, and its sweeps take seconds.
_LAST: dict[str, Model] = {}


def model_of(params: dict[str, Any], rows: list[dict[str, Any]], *,
             sweeps: bool = True) -> Model:
    """The run's model: its profile and inputs, the recoveries its rows measured (or the
    timelines it read), the outcome over its traces, and each sweep."""
    key = json.dumps([params, rows, sweeps], sort_keys=True, default=str)
    if key not in _LAST:
        _LAST.clear()
        _LAST[key] = _model(params, rows, sweeps)
    return _LAST[key]


def _model(params: dict[str, Any], rows: list[dict[str, Any]], sweeps: bool) -> Model:
    profile, inputs = profile_of(params), inputs_of(params)
    recoveries = Recoveries.from_rows(rows)
    traces, seed = int(params["traces"]), int(params["seed"])
    outcome = simulate(profile, inputs, recoveries, traces=traces, seed=seed)
    swept = {name: sweep(name, profile, inputs, recoveries, traces=max(20, traces // 2),
                         seed=seed) for name in swept_names(params)} if sweeps else {}
    return Model(profile, inputs, recoveries, outcome, swept)


def rig_plays_link_up(params: dict[str, Any]) -> bool:
    """Whether the replay's recoveries hold the lab's hosts' own NIC link-up."""
    rig = params.get("rig_link_up")
    return rig == "mixnet" or (isinstance(rig, int | float) and rig > 0)


def swept_names(params: dict[str, Any]) -> list[str]:
    """The sweeps a run's model runs: not the NIC link-up's where the measured recoveries
    hold a link-up already (the sweep would add its values on top of it)."""
    return [n for n in SWEEPS if n != "link-up" or not rig_plays_link_up(params)]


def _pct(e: Estimate) -> str:
    return f"{e.mean * 100:.2f} % ({e.low * 100:.2f}{DASH}{e.high * 100:.2f})"


def _gpu_h(e: Estimate) -> str:
    return f"{e.mean:,.0f} ({e.low:,.0f}{DASH}{e.high:,.0f})"


def replay_table(run: Run, rows: list[dict[str, Any]], model: Model) -> Table:
    """Per class: the failures modelled (in the replayed trace, and the rate's expectation
    with its 95 % Poisson interval), driven on the rig, and recovered there."""
    params = run.params
    modelled: dict[str, int] = params.get("modelled") or {}
    inputs = model.inputs
    expected = model.profile.expected(inputs.gpus, inputs.hours, inputs.rate_scale)
    driven = {c.id: [r for r in rows if r.get("class") == c.id] for c in model.profile.classes}
    total_driven = sum(len(v) for v in driven.values())
    total = sum(modelled.values())
    compression = params.get("compression")
    if params.get("timelines"):
        how = (f"none driven: recoveries from {len(rows)} recorded failovers "
               f"(timelines {params['timelines']})")
    else:
        how = (f"{total_driven} of {total} modelled failures driven on {conditions(run)}"
               + (f", time compressed {compression:,.0f}x" if compression else ""))
    table = Table(title=f"run {run.name}: {model.profile.name} on {inputs.gpus:,} GPUs for "
                        f"{inputs.hours:g} h; {how}",
                  caption="driven: on the rig, through labd's recovery (path gpu: the GPU "
                          "failure the host reports; host: the host stops); other: no "
                          "recovery path on the rig, modelled only")
    for column in ("class", "path", "modelled", "expected (95 %)", "driven", "recovered",
                   "failure → links up p50, ms"):
        table.add_column(column, justify="left" if column in ("class", "path") else "right")
    for c in model.profile.classes:
        mine = driven[c.id]
        up = [r["ms"]["links_up"] for r in mine if "links_up" in r.get("ms", {})]
        low, high = poisson_interval(expected[c.id])
        path = c.path if c.path != "none" else "other"
        if c.path == "gpu":
            path += f" ({c.signal})"
        table.add_row(c.label, path, str(modelled.get(c.id, "")),
                      f"{expected[c.id]:.1f} ({low}{DASH}{high})",
                      str(len(mine)) if c.path != "none" else DASH,
                      str(sum(1 for r in mine if r["outcome"] == "recovered"))
                      if c.path != "none" else DASH,
                      f"{percentile(up, 50):.1f}" if up else DASH)
    return table


def recovery_table(rows: list[dict[str, Any]], model: Model) -> Table:
    """The rig's recoveries per path, as the model draws them (seconds → ms)."""
    rec = model.recoveries
    late = [r["late_s"] for r in rows if r.get("late_s")]
    table = Table(title="Measured recoveries (what the model draws from), ms",
                  caption="links up → first step is the emulated job's restart: the model "
                          "takes the framework's restart from its inputs instead"
                          + (f"; {len(late)} of {len(rows)} failures were injected late (the "
                             "last recovery and its compressed repair still going), by up "
                             f"to {max(late):.2f} s" if late else ""))
    for column in ("path", "n", "detect p50", "detect p99", "switch p50", "rest p50",
                   "failure → links up p50", "p99"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for path in ("gpu", "host"):
        detect = rec.detect_s[path] * 1000
        total = (rec.detect_s[path] + rec.switching_s[path] + rec.rest_s[path]) * 1000
        label = path + (" (none driven: every path's)" if path in rec.pooled else "")
        table.add_row(label, str(len(detect)), f"{percentile(list(detect), 50):.1f}",
                      f"{percentile(list(detect), 99):.1f}",
                      f"{percentile(list(rec.switching_s[path] * 1000), 50):.1f}",
                      f"{percentile(list(rec.rest_s[path] * 1000), 50):.1f}",
                      f"{percentile(list(total), 50):.1f}", f"{percentile(list(total), 99):.1f}")
    return table


def ettr_table(model: Model) -> Table:
    o, inputs = model.outcome, model.inputs
    if o.no_spare_share is None:
        pool = "no draw had a failure with a recovery path: none needed a spare"
    else:
        pool = (f"{o.no_spare_share.mean * 100:.1f} % ({o.no_spare_share.low * 100:.1f}"
                f"{DASH}{o.no_spare_share.high * 100:.1f}) of the failures with a recovery "
                f"path found no spare free, over the {o.no_spare_traces} of {o.traces} draws "
                "that had one")
    table = Table(title=f"ETTR and GPU-hours lost per strategy: mean (95 % interval) over "
                        f"{o.traces} draws of the failure process, {o.failures.mean:.0f} "
                        f"failures each ({o.failures.low:.0f}{DASH}{o.failures.high:.0f}); "
                        f"{inputs.spare_hosts} spare hosts",
                  caption="optical keeps: GPU-hours the optical swap loses less than the "
                          f"strategy, paired on the same draws; {pool}")
    for column in ("strategy", "ETTR", "GPU-hours lost", "optical keeps"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for s in STRATEGIES:
        kept = o.kept_over.get(s)
        table.add_row(STRATEGY_LABELS[s], _pct(o.ettr[s]), _gpu_h(o.gpu_hours_lost[s]),
                      _gpu_h(kept) if kept is not None else DASH)
    return table


def class_table(model: Model) -> Table:
    table = Table(title="GPU-hours lost per class and strategy, mean (95 % interval)")
    table.add_column("class")
    for s in STRATEGIES:
        table.add_column(STRATEGY_LABELS[s], justify="right")
    for c in model.profile.classes:
        by = model.outcome.by_class[c.id]
        label = c.label + ("" if c.path != "none" else " (other)")
        table.add_row(label, *(_gpu_h(by[s]) for s in STRATEGIES))
    return table


def sweep_tables(model: Model) -> list[Table]:
    out = []
    for name, points in model.sweeps.items():
        what, _ = SWEEPS[name]
        table = Table(title=f"Sweep: ETTR against {what} (mean, 95 % interval; "
                            f"{points[0][1].traces} draws per value)")
        table.add_column(what, justify="right")
        for s in STRATEGIES:
            table.add_column(STRATEGY_LABELS[s], justify="right")
        for value, outcome in points:
            table.add_row(f"{value:g}", *(_pct(outcome.ettr[s]) for s in STRATEGIES))
        out.append(table)
    return out


def sources_table(run: Run, rows: list[dict[str, Any]], model: Model) -> Table:
    """Where each number came from: measured on the rig, a model input (its source), or
    the user's."""
    given = set(run.params.get("given") or [])
    inputs, profile = model.inputs, model.profile

    def whence(option: str, default_source: str) -> str:
        return "user-given" if option in given else default_source

    measured_on = run.params.get("timelines") or f"{conditions(run)} ({len(rows)} drills)"
    table = Table(title="Where the numbers come from",
                  caption="The emulated hosts run no real framework: their restart (links "
                          "up → first step) is an emulator's, so the model takes the "
                          "framework's restart from its inputs.")
    for column in ("figure", "value", "from"):
        table.add_column(column)
    table.add_row("each recovery: failure → detected → every new link up",
                  "drawn per failure (the detection for every strategy)",
                  f"measured: {measured_on}")
    table.add_row("failure rates per class", f"{profile.total():g} over {profile.gpus:,} "
                  f"GPUs, {profile.hours:g} h", f"profile {profile.name}: {profile.source}")
    table.add_row("modelled job", f"{inputs.gpus:,} GPUs, {inputs.hours:g} h, "
                  f"{inputs.gpus_per_host} per host",
                  whence("job", "the profile's source"))
    restart = ", ".join(f"{k} {v:.1f} s" for k, v in inputs.restart_s.items())
    table.add_row("framework restart", restart,
                  whence("restart", "TrainMover (citing Alibaba HPN): 4.45 min of "
                                    "initialisation, 35.1 / 24.5 / 40.4 %"))
    table.add_row("checkpoint interval", f"{inputs.checkpoint_min:g} min",
                  whence("checkpoint", "an assumption (no source)"))
    table.add_row("NIC link-up after the switch, added to each measured recovery",
                  f"{inputs.link_up_s:g} s", link_up_source(run.params, inputs))
    table.add_row("standby without a fabric (re-cabling, scheduler)",
                  f"{inputs.standby_s:.1f} s",
                  whence("standby", "the rest of TrainMover's 6.47 min per interruption"))
    repair = inputs.repair_of(profile)
    table.add_row("repair time per class",
                  ", ".join(f"{c.id} {h:g} h" for c, h in zip(profile.classes, repair,
                                                              strict=True)),
                  whence("repair", "an assumption (no source): 4 h for a GPU or host, 0 for "
                                   "the rest (restarted in place)"))
    table.add_row("spare hosts", str(inputs.spare_hosts),
                  whence("spares", f"TrainMover: ~{STANDBY_SHARE:.0%} of GPUs on standby"))
    if inputs.ocs_ms is not None:
        table.add_row("OCS switching time", f"{inputs.ocs_ms:g} ms", "user-given (in place "
                      "of the measured)")
    return table


def rig_link_up(lab: Lab) -> float | str:
    """The NIC link-up a lab's emulated hosts play after the light arrives: ``"mixnet"``
    where any host draws it from MixNet's measurement, else the longest fixed one, ms. The
    replay's recoveries (failure → every new link up) include it, uncompressed."""
    values = [h.link_up_ms for h in lab.host]
    if "mixnet" in values:
        return "mixnet"
    return max((float(v) for v in values), default=0.0)


def link_up_source(params: dict[str, Any], inputs: ModelInputs) -> str:
    """Where the model's NIC link-up came from, and whether the measured recoveries hold
    one already (so that it is counted once)."""
    rig = params.get("rig_link_up")
    if params.get("timelines"):
        held = ("recorded recoveries: on real NICs their links up holds the NICs' link-up "
                "already")
    elif rig == "mixnet":
        held = ("the lab's hosts play link_up_ms = \"mixnet\" (5.67 s mean), so each "
                "measured recovery holds it already")
    elif isinstance(rig, int | float) and rig > 0:
        held = (f"the lab's hosts play link_up_ms up to {rig:g} ms, so each measured "
                "recovery holds it already")
    elif rig is not None:
        held = "the lab's hosts play none (link_up_ms = 0)"
    else:
        held = "what the lab's hosts played was not kept with this run"
    if inputs.link_up_s == MIXNET_LINK_UP_S and "link-up" in (params.get("given") or []):
        added = "MixNet (SIGCOMM 2025): OCS done → NIC active, mean (--link-up-s mixnet)"
    elif "link-up" in (params.get("given") or []):
        added = "user-given"
    else:
        added = "none added (--link-up-s 0)"
    swept = "; the NIC link-up sweep is left out" if rig_plays_link_up(params) else ""
    return f"{added}; {held}{swept}"


def availability_report(run: Run, rows: list[dict[str, Any]], model: Model) -> list[Table]:
    """Every table of an availability run, in the order the command prints them."""
    return [replay_table(run, rows, model), recovery_table(rows, model), ettr_table(model),
            class_table(model), *sweep_tables(model), sources_table(run, rows, model)]


def compare_availability(a: Run, rows_a: list[dict[str, Any]], b: Run,
                         rows_b: list[dict[str, Any]], *, noise_ms: float) -> list[Table]:
    """Two availability runs: the rig's recoveries per path (p50 and p99 of failure →
    detected and → links up, with bootstrap verdicts), then each strategy's ETTR."""
    if a.kind != "availability" or b.kind != "availability":
        raise LabdError("both runs must be availability runs")
    measured = Table(title=f"{a.name} ({conditions(a)}) → {b.name} ({conditions(b)}): "
                           "recoveries, ms after the failure")
    for column in ("path", "stage", "n", a.name, b.name, "verdict"):
        measured.add_column(column, justify="right" if column in ("n", a.name, b.name)
                            else "left")
    for path in ("gpu", "host"):
        for stage in ("detected", "links_up"):
            x = [r["ms"][stage] for r in rows_a if r.get("kind") == path
                 and stage in r.get("ms", {})]
            y = [r["ms"][stage] for r in rows_b if r.get("kind") == path
                 and stage in r.get("ms", {})]
            if not x and not y:
                continue
            for q in (50, 99):
                said = compare_values(x, y, q, names=(a.name, b.name), noise_ms=noise_ms)
                measured.add_row(path, f"{stage} p{q}", f"{len(x)} / {len(y)}",
                                 *(DASH if v is None else f"{v:.1f}" for v in (said.a, said.b)),
                                 said.verdict)
    ma = model_of(a.params, rows_a, sweeps=False)
    mb = model_of(b.params, rows_b, sweeps=False)
    ettr = Table(title="ETTR per strategy, mean (95 % interval over each run's draws)",
                 caption="different where the intervals do not overlap")
    for column in ("strategy", a.name, b.name, "verdict"):
        ettr.add_column(column, justify="left" if column in ("strategy", "verdict")
                        else "right")
    for s in STRATEGIES:
        ea, eb = ma.outcome.ettr[s], mb.outcome.ettr[s]
        if eb.low > ea.high:
            verdict = f"{b.name} keeps more: +{(eb.mean - ea.mean) * 100:.2f} points"
        elif eb.high < ea.low:
            verdict = f"{b.name} keeps less: {(eb.mean - ea.mean) * 100:.2f} points"
        else:
            verdict = "no difference beyond the draws' spread"
        ettr.add_row(STRATEGY_LABELS[s], _pct(ea), _pct(eb), verdict)
    return [measured, ettr]
