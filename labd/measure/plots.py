"""Plots of measurement runs (matplotlib, drawn off-screen), sized for a paper: latency CDFs
with the emulator's truth beside labd's figures, latency against batch size, failover stage
stacks and schedule windows against reconfiguration time. Each ``*_plots`` function writes
its files under a folder and returns their paths; each ``*_figures`` one returns the figures
unsaved.

What every figure keeps to:

- a column (3.5 in) wide for one panel, a page (7 in) for several, text at 7-9 pt;
- n in every legend entry, and the lab, the switch's make and model, and whether it was
  emulated in the titles;
- the legend in a strip of its own under the panel, so that it never covers a line;
- a p99 from fewer than 100 values is drawn hollow and its entry says so: it is then the
  largest value or near it, which still shows where the slowest changes lie;
- a log axis only where every value is positive (symlog otherwise: a value at or below zero
  is drawn, not dropped);
- SVG text as text (searchable, editable) and PDF fonts embedded as TrueType, as
  publishers ask.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from labd.errors import LabdError
from labd.measure.stats import enough

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from labd.measure.runs import Run

FORMATS = ("png", "svg", "pdf")
COLUMN_IN = 3.5
PAGE_IN = 7.0
#: One panel's plotting area, and one legend line, in inches.
PANEL_IN = 1.9
LEGEND_LINE_IN = 0.16

#: Matplotlib settings for every figure here: small text for a paper, and files that say
#: the same for the same run (no dates, fixed SVG ids).
RC: dict[str, Any] = {
    "font.size": 8, "axes.titlesize": 7, "axes.labelsize": 8, "legend.fontsize": 7,
    "xtick.labelsize": 7, "ytick.labelsize": 7, "figure.titlesize": 9,
    "lines.linewidth": 1.2, "svg.fonttype": "none", "svg.hashsalt": "labd",
    "pdf.fonttype": 42, "ps.fonttype": 42,
}
_NO_DATE = {"svg": {"Date": None}, "pdf": {"CreationDate": None}, "png": {}}


@dataclass(frozen=True)
class PlotStyle:
    """What files the plots are written as: ``format`` (png, svg or pdf) and, for PNG, the
    resolution."""

    format: str = "png"
    dpi: int = 150

    def check(self) -> None:
        if self.format not in FORMATS:
            raise LabdError(f"plot format {self.format!r}: expected one of "
                            f"{', '.join(FORMATS)}")
        if not 50 <= self.dpi <= 1200:
            raise LabdError(f"dpi {self.dpi}: expected 50 to 1200 (300 for print)")


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise LabdError("plots need matplotlib: pip install 'labd[measure]'") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(figures: list[tuple[str, Figure]], folder: Path, style: PlotStyle) -> list[Path]:
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, fig in figures:
        path = folder / f"{stem}.{style.format}"
        with plt.rc_context(RC):
            fig.savefig(path, dpi=style.dpi, format=style.format,
                        metadata=_NO_DATE[style.format])
        plt.close(fig)
        written.append(path)
    return written


def _panels(count: int, legend_lines: int) -> tuple[Figure, list[tuple[Axes, Axes]]]:
    """A figure of ``count`` panels (up to three a row), each with a strip under it for
    its legend: (plot, legend strip) per panel."""
    plt = _pyplot()
    columns = 2 if count == 4 else min(count, 3)
    rows = math.ceil(count / columns)
    strip = LEGEND_LINE_IN * legend_lines + 0.1
    width = COLUMN_IN if count == 1 else PAGE_IN
    fig = plt.figure(figsize=(width, rows * (PANEL_IN + strip) + 0.35), layout="constrained")
    grid = fig.add_gridspec(2 * rows, columns, height_ratios=[PANEL_IN, strip] * rows)
    out = []
    for i in range(count):
        row, column = divmod(i, columns)
        ax = fig.add_subplot(grid[2 * row, column])
        strip_ax = fig.add_subplot(grid[2 * row + 1, column])
        strip_ax.axis("off")
        out.append((ax, strip_ax))
    return fig, out


def _suptitle(fig: Figure, text: str) -> None:
    """The figure's title, each line wrapped to the figure's width: a run's name and its
    schedule's do not shrink to fit, and a column-wide figure cut them at both ends."""
    size = float(RC["figure.titlesize"])
    # An average glyph of DejaVu Sans is a little over half the font's size wide.
    fits = max(20, int(fig.get_figwidth() * 72 / (size * 0.56)))
    fig.suptitle("\n".join(textwrap.fill(line, fits, break_on_hyphens=False)
                           for line in text.split("\n")))


def _legend(ax: Axes, strip: Axes, columns: int = 1) -> None:
    handles, labels = ax.get_legend_handles_labels()
    strip.legend(handles, labels, loc="upper center", frameon=False, ncol=columns,
                 borderaxespad=0)


def _x_scale(ax: Axes, values: list[float]) -> None:
    """Log where the values are all positive and span a decade or more; symlog where some
    are at or below zero and the rest reach a decade beyond them (linear around zero out to
    the power of ten those reach: none of them dropped); linear otherwise, where a log axis
    would only crowd its labels."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    low, high = min(values, default=1.0), max(values, default=1.0)
    if low > 0 and high / low >= 10:
        ax.set_xscale("log")
    elif low <= 0:
        reach = max(abs(v) for v in values if v <= 0)
        linear = 10 ** math.ceil(math.log10(reach)) if reach else 0.01
        if high < 10 * linear:
            return
        ax.set_xscale("symlog", linthresh=linear)
    else:
        return
    if ax.get_xscale() == "log" and high / low < 1000:
        # Under three decades a decade's ticks alone leave one or two labels: 1-2-5 steps.
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(NullFormatter())


#: The CDF's series: figure, legend words, line.
CDF_SERIES = (("device", "labd device time", "-"), ("light", "labd light verified", "--"),
              ("truth", "emulator's truth (settled)", ":"))


def reconfig_figures(run: Run, rows: list[dict[str, Any]]) -> list[tuple[str, Figure]]:
    """``<run>-cdf``: per switch, labd's device and light times and the emulator's truth as
    CDFs; and where the run has several batch sizes, ``<run>-batch``: per switch, the
    device time's p50 and p99 (and the truth's p50) against batch size."""
    from labd.measure.figures import conditions, figure_values, summarise, switch_label

    plt = _pyplot()
    values = figure_values(rows, full=False)
    switches = sorted({switch for switch, _, _ in values})
    out = []
    with plt.rc_context(RC):
        fig, panels = _panels(max(len(switches), 1), len(CDF_SERIES))
        for switch, (ax, strip) in zip(switches, panels, strict=False):
            shown: list[float] = []
            for colour, (figure, words, line) in enumerate(CDF_SERIES):
                ordered = sorted(values.get((switch, None, figure), []))
                if not ordered:
                    continue
                shown += ordered
                fraction = [(i + 1) / len(ordered) for i in range(len(ordered))]
                # gid: the series is named in an SVG (``<g id="ocs1-truth">``).
                ax.step(ordered, fraction, where="post", linestyle=line, color=f"C{colour}",
                        label=f"{words} (n = {len(ordered)})", gid=f"{switch}-{figure}")
            _cdf_frame(ax, strip, shown, "ms from dispatch", switch_label(run, switch, sep="\n"))
        _suptitle(fig, f"{conditions(run)}\nreconfiguration times (run {run.name})")
        out.append((f"{run.name}-cdf", fig))

        # What labd adds to the switch's own time: a fraction of a millisecond that the CDF
        # above cannot show beside times of tens of milliseconds.
        added = {switch: sorted(values.get((switch, None, "switching - truth"), []))
                 for switch in switches}
        added = {switch: v for switch, v in added.items() if v}
        if added:
            fig, panels = _panels(len(added), 1)
            for (switch, ordered), (ax, strip) in zip(added.items(), panels, strict=True):
                ax.step(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))],
                        where="post", color="C3", gid=f"{switch}-added",
                        label=f"labd's switching time - emulator's truth (n = {len(ordered)})")
                if ordered[0] <= 0:
                    ax.axvline(0, color="grey", linewidth=0.8, linestyle=":")
                _cdf_frame(ax, strip, ordered, "ms labd adds to the switch's own time",
                           switch_label(run, switch, sep="\n"))
            _suptitle(fig, f"{conditions(run)}\nlabd - truth per change (run {run.name})")
            out.append((f"{run.name}-added", fig))

        summary = summarise(rows)
        sizes: dict[str, list[int]] = {}
        for switch, k, figure in summary:
            if figure == "device":
                sizes.setdefault(switch, []).append(k)
        if any(len(ks) > 1 for ks in sizes.values()):
            fig, panels = _panels(len(sizes), 6)
            for (switch, ks), (ax, strip) in zip(sorted(sizes.items()), panels, strict=True):
                _batch_panel(ax, summary, switch, sorted(ks))
                ax.set_title(switch_label(run, switch, sep="\n"))
                _legend(ax, strip)
            _suptitle(fig, f"{conditions(run)}\ndevice time against batch size "
                           f"(run {run.name})")
            out.append((f"{run.name}-batch", fig))
    return out


def _cdf_frame(ax: Axes, strip: Axes, values: list[float], xlabel: str, title: str) -> None:
    """A CDF panel's axes, title, grid and legend strip."""
    _x_scale(ax, values)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of changes")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, strip)


def _n_text(ns: list[int]) -> str:
    return f"n = {ns[0]}" if min(ns) == max(ns) else f"n = {min(ns)}\N{EN DASH}{max(ns)}"


def _batch_panel(ax: Axes, summary: dict[tuple[str, int, str], dict[str, float]],
                 switch: str, ks: list[int]) -> None:
    from matplotlib.ticker import FormatStrFormatter

    device = [summary[(switch, k, "device")] for k in ks]
    ns = [int(s["n"]) for s in device]
    ax.fill_between(ks, [s["p25"] for s in device], [s["p75"] for s in device], color="C0",
                    alpha=0.2, linewidth=0, label="device p25 to p75 (the middle half)")
    ax.plot(ks, [s["p50"] for s in device], marker="o", color="C0",
            label=f"device p50 ({_n_text(ns)} per size)")
    solid = [enough(n, 99) for n in ns]
    # Hollow where a p99 rests on fewer than 100 values; the legend shows the hollow one
    # and says so where any is.
    ax.plot(ks, [s["p99"] for s in device], linestyle="--", color="C0", marker="^",
            markerfacecolor="C0" if all(solid) else "none",
            label=f"device p99 ({_n_text(ns)} per size)"
                  + ("" if all(solid) else "\nhollow: from < 100 values, near the max"))
    for k, s, full in zip(ks, device, solid, strict=True):
        if full:
            ax.plot([k], [s["p99"]], marker="^", color="C0")
    truth = [summary.get((switch, k, "truth")) for k in ks]
    if all(truth):
        ax.plot(ks, [s["p50"] for s in truth if s], marker=".", linestyle=":", color="C2",
                label=f"emulator's truth p50 ({_n_text([int(s['n']) for s in truth if s])} "
                      "per size)")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.set_xlabel("pairs per change (batch size)")
    ax.set_ylabel("ms")
    ax.grid(True, alpha=0.3)


def reconfig_plots(run: Run, rows: list[dict[str, Any]], folder: Path,
                   style: PlotStyle = PlotStyle()) -> list[Path]:
    """The reconfiguration figures (``reconfig_figures``) written under ``folder``."""
    return _save(reconfig_figures(run, rows), folder, style)


def schedule_figures(run: Run, rows: list[dict[str, Any]]) -> list[tuple[str, Figure]]:
    """``<run>-windows``: each window that needed a reconfiguration, its idle time against
    the reconfiguration's; below the diagonal, hidden (when started at the window's
    beginning)."""
    from labd.measure.figures import conditions, switch_label

    plt = _pyplot()
    with plt.rc_context(RC):
        fig, [(ax, strip)] = _panels(1, 3)
        top = 0.0
        for mode, marker in (("on demand", "x"), ("speculative", "o")):
            mine = [r for r in rows if r["mode"] == mode and r["changed"]]
            if not mine:
                continue
            gaps = [r["gap_ms"] for r in mine]
            took = [r["reconfig_ms"] for r in mine]
            top = max(top, *gaps, *took)
            hidden = sum(1 for r in mine if r["hidden"]) / len(mine) * 100
            ax.scatter(gaps, took, marker=marker, alpha=0.6, s=12,
                       label=f"{mode}: {hidden:.0f} % hidden (n = {len(mine)})")
        ax.plot([0, top], [0, top], color="grey", linestyle=":",
                label="window = reconfiguration")
        ax.set_xlabel("idle window before the phase (schedule), ms")
        ax.set_ylabel("request → answer, ms")
        switches = sorted({s for r in rows for s in r["changed"]})
        ax.set_title("\n".join(switch_label(run, s) for s in switches) or "no switch changed")
        ax.grid(True, alpha=0.3)
        _legend(ax, strip)
        _suptitle(fig, f"{conditions(run)}\n{run.params.get('schedule', run.name)} "
                       f"(run {run.name})")
    return [(f"{run.name}-windows", fig)]


def schedule_plots(run: Run, rows: list[dict[str, Any]], folder: Path,
                   style: PlotStyle = PlotStyle()) -> list[Path]:
    """The schedule figures (``schedule_figures``) written under ``folder``."""
    return _save(schedule_figures(run, rows), folder, style)


#: A recovery's steps, each from the stage before: (label, stage reached).
STEPS = (("detect", "detected"), ("choose a spare", "spare_chosen"),
         ("switch", "switches_acked"), ("links up", "links_up"),
         ("restart", "job_restarted"), ("collectives", "collectives_ready"),
         ("first step", "first_step"))


def failover_figures(run: Run, rows: list[dict[str, Any]]) -> list[tuple[str, Figure]]:
    """``<run>-stages``: each drill's recovery as a stack of its steps (ms after the
    failure), GPU failures then lost hosts."""
    from labd.measure.figures import conditions

    plt = _pyplot()
    drills = [r for r in rows if "first_step" in r["ms"]]
    drawn = {label: 0 for label, _ in STEPS}
    with plt.rc_context(RC):
        fig = plt.figure(figsize=(PAGE_IN, PANEL_IN + 0.9), layout="constrained")
        grid = fig.add_gridspec(1, 2, width_ratios=[5, 1.4])
        ax, strip = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
        strip.axis("off")
        for position, row in enumerate(drills):
            previous = 0.0
            for index, (label, stage) in enumerate(STEPS):
                at = row["ms"].get(stage)
                if at is None or at < previous:
                    continue  # light can come before the switch says done: drawn in order
                ax.bar(position, at - previous, bottom=previous, color=f"C{index}", width=0.8,
                       label=label if not drawn[label] else None)
                drawn[label] += 1
                previous = at
        handles, labels = ax.get_legend_handles_labels()
        strip.legend(handles, [f"{label} (n = {drawn[label]})" for label in labels],
                     loc="center left", frameon=False, borderaxespad=0)
        ax.set_xlabel("drill (GPU failures, then hosts lost)")
        ax.set_ylabel("ms after the failure")
        ax.grid(True, axis="y", alpha=0.3)
        _suptitle(fig, f"{conditions(run)}: recovery stage by stage, n = {len(drills)} "
                       f"drills (run {run.name})")
    return [(f"{run.name}-stages", fig)]


def failover_plots(run: Run, rows: list[dict[str, Any]], folder: Path,
                   style: PlotStyle = PlotStyle()) -> list[Path]:
    """The failover figure (``failover_figures``) written under ``folder``."""
    return _save(failover_figures(run, rows), folder, style)
