"""The figures of a kept run's rows: each reconfiguration's spans in ms, grouped and summed
up per switch, batch size and figure, and how titles name a run and a switch.
"""

from __future__ import annotations

from typing import Any

from labd.measure.runs import Run
from labd.vocabulary import SPANS, percentile, span_ms


def row_values(row: dict[str, Any]) -> dict[str, float]:
    """The figures of one row, in ms: each span of labd.vocabulary.SPANS, and where the lab was
    emulated, the device's true time and labd's excess over it (of the switching time:
    the emulator times the mirrors from the command that moves them)."""
    values = {name: v for name, a, b in SPANS if (v := span_ms(row, a, b)) is not None}
    if "switching" not in values and "device" in values:  # rows kept before it was recorded
        values["switching"] = values["device"]
    truth = row.get("truth_ms")
    if truth is not None:
        values["truth"] = truth
        if "switching" in values:
            values["switching - truth"] = values["switching"] - truth
    return values


#: The figures of a reconfiguration, in the order reports give them.
FIGURES = ("device", "switching", "light", "software", "total", "truth", "switching - truth")


def figure_order(figure: str) -> int:
    return FIGURES.index(figure) if figure in FIGURES else len(FIGURES)


def figure_values(rows: list[dict[str, Any]], *, full: bool = True
                  ) -> dict[tuple[str, int | None, str], list[float]]:
    """(switch, batch size, figure) → the values of the rows that succeeded, in ms; the
    batch size None where ``full`` is false (every batch size together)."""
    groups: dict[tuple[str, int | None, str], list[float]] = {}
    for row in rows:
        if row.get("outcome") != "ok":
            continue
        for name, value in row_values(row).items():
            key = (row["switch"], int(row["k"]) if full else None, name)
            groups.setdefault(key, []).append(value)
    return {key: groups[key] for key in sorted(
        groups, key=lambda g: (g[0], g[1] or 0, figure_order(g[2]), g[2]))}


def stats_of(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p25": percentile(values, 25), "p50": percentile(values, 50),
            "p75": percentile(values, 75), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "max": max(values)}


def summarise(rows: list[dict[str, Any]]) -> dict[tuple[str, int, str], dict[str, float]]:
    """(switch, batch size, figure) → n, p50, p90, p99, max over the rows that succeeded."""
    return {(s, k or 0, f): stats_of(v) for (s, k, f), v in figure_values(rows).items()}


def emulated(run: Run) -> bool:
    """Whether the run was measured on emulators (runs kept before this was recorded: a
    lab file's run always was)."""
    said = run.params.get("emulated")
    return bool(said) if said is not None else run.target.endswith("(emulated)")


def conditions(run: Run) -> str:
    """What a run was measured on, for titles: the lab and whether it was emulated."""
    return f"lab {run.lab_name}, {'emulated' if emulated(run) else 'real'}"


def switch_label(run: Run, switch: str, sep: str = ", ") -> str:
    """A switch as titles name it: its id, make and model, and the timing model it was set
    to (emulated); ``sep`` between the model and the timing."""
    model = (run.params.get("switch_models") or {}).get(switch)
    timing = run.params.get("timing") or {}
    label = f"{switch}: {model}" if model else switch
    if switch in timing.get("switches", []):
        label += f"{sep}{timing['switch_time_ms']:g} ± {timing['jitter_ms']:g} ms model"
    return label
