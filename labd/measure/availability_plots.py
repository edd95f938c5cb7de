"""Plots of an availability run's sweeps: ETTR of each strategy against one design
parameter, its 95 % interval shaded, drawn with the habits of labd.measure.plots (a column
wide, the legend in a strip of its own, n in every entry, the lab in the title)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from labd.measure.ettr import STRATEGIES, STRATEGY_LABELS, SWEEPS, Estimate
from labd.measure.plots import RC, PlotStyle, _legend, _panels, _pyplot, _save, _suptitle

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from labd.measure.availability_report import Model
    from labd.measure.runs import Run

#: Each strategy's line and marker.
STYLE = {"optical": ("-", "o"), "no-spare": (":", "s"), "standby": ("--", "^")}


def availability_figures(run: Run, model: Model) -> list[tuple[str, Figure]]:
    """``<run>-sweep-<name>`` for each sweep: on the left ETTR (%) of each strategy against
    the swept value, on the right the GPU-hours the optical swap keeps over a standby
    without a fabric (paired on the same draws: the two lie close on the left); the 95 %
    interval over the draws shaded."""
    from labd.measure.figures import conditions

    plt = _pyplot()
    out = []
    with plt.rc_context(RC):
        for name, points in model.sweeps.items():
            what, _ = SWEEPS[name]
            fig, [(ax, strip), (kept_ax, kept_strip)] = _panels(2, len(STRATEGIES))
            xs = [v for v, _ in points]
            n = points[0][1].traces
            for colour, s in enumerate(STRATEGIES):
                line, marker = STYLE[s]
                _band(ax, xs, [o.ettr[s] for _, o in points], 100, colour, line, marker,
                      f"{STRATEGY_LABELS[s]} (n = {n} draws per value)", f"{name}-{s}")
            _band(kept_ax, xs, [o.kept_over["standby"] for _, o in points], 1 / 1000, 0, "-",
                  "o", f"optical swap over standby (n = {n} draws per value)",
                  f"{name}-kept")
            kept_ax.axhline(0, color="grey", linewidth=0.6)
            for panel in (ax, kept_ax):
                _x_axis(panel, name)
                panel.set_xlabel(what)
                panel.grid(True, which="both", alpha=0.3)
            ax.set_ylabel("ETTR, %")
            kept_ax.set_ylabel("GPU-hours kept, thousands")
            ax.set_title(_title(model))
            kept_ax.set_title("training kept by the optical swap over a standby host")
            _legend(ax, strip)
            _legend(kept_ax, kept_strip)
            _suptitle(fig, f"{conditions(run)}: recoveries measured, job modelled; ETTR "
                           f"against {what.split(',')[0]} (run {run.name})")
            out.append((f"{run.name}-sweep-{name}", fig))
    return out


def _band(ax: Axes, xs: list[float], values: list[Estimate], unit: float, colour: int,
          line: str, marker: str, label: str, gid: str) -> None:
    """A line of means with its 95 % interval shaded."""
    ax.plot(xs, [e.mean * unit for e in values], linestyle=line, marker=marker,
            markersize=3, color=f"C{colour}", gid=gid, label=label)
    ax.fill_between(xs, [e.low * unit for e in values], [e.high * unit for e in values],
                    color=f"C{colour}", alpha=0.15, linewidth=0)


def _x_axis(ax: Axes, name: str) -> None:
    """Log for the switching time and the rate, symlog for counts from zero (the spare
    pool, link-up from 0 s)."""
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullFormatter

    if name == "ocs":
        ax.set_xscale("log")
    elif name == "rate":
        ax.set_xscale("log")
        # Each rate swept is a tick: a log axis from 0.25 to 4 would mark only 1.
        ax.xaxis.set_major_locator(FixedLocator(list(SWEEPS[name][1])))
    elif name == "spares":
        ax.set_xscale("symlog", linthresh=1)
        ax.set_xlim(left=0)
        # Each pool size swept is a tick: symlog would mark -1 and skip the powers of two.
        ax.xaxis.set_major_locator(FixedLocator(list(SWEEPS[name][1])))
    else:
        return
    ax.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _title(model: Model) -> str:
    inputs = model.inputs
    return (f"{model.profile.name}: {inputs.gpus:,} GPUs, {inputs.hours:g} h, "
            f"checkpoint every {inputs.checkpoint_min:g} min")


def availability_plots(run: Run, rows: list[dict[str, Any]], folder: Path,
                       style: PlotStyle | None = None, model: Model | None = None
                       ) -> list[Path]:
    """The sweep figures written under ``folder`` (the run's model computed again from
    its rows where not given)."""
    from labd.measure.availability_report import model_of

    return _save(availability_figures(run, model or model_of(run.params, rows)), folder,
                 style or PlotStyle())
