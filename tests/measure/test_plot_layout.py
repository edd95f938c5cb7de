"""The measure plots as a paper needs them: no text cut at any resolution, every axis with
at least two labelled ticks, what labd adds over the truth drawn on its own axis, and the
spread of each batch size drawn."""

from __future__ import annotations

from typing import Any

import pytest

from labd.measure.plots import RC, _pyplot, failover_figures, reconfig_figures
from labd.measure.runs import Run
from tests.measure.test_reports import a_run, change


def demo_like() -> list[dict[str, Any]]:
    """Four switches as the demo lab has them: a mesh under a millisecond, a Polatis whose
    light comes long before its answer, one spread over a decade, a slow CALIENT."""
    rows = []
    for switch, base in (("mesh1", 0.3), ("ocs1", 25.0), ("ocs2", 2.0), ("ocs3", 45.0)):
        for i in range(120):
            device = base + (i / 6 if switch == "ocs2" else (i % 10) * base / 50)
            rows.append(change(i, switch, device_ms=device + 0.08, truth_ms=device,
                               light_ms=1.4 + i % 3 if switch == "ocs1" else None,
                               k=(1, 2, 4, 8)[i % 4]))
    return rows


def failover_run() -> tuple[Run, list[dict[str, Any]]]:
    run = Run(name="f1", kind="failover", params={}, labd_version="0", lab_name="failover",
              target="lab failover.toml (emulated)", lab_sha256="", planned=0,
              status="complete")
    return run, [{"kind": "gpu", "outcome": "recovered", "ms": {
        "detected": 1.0, "spare_chosen": 2.0, "switches_acked": 30.0 + i, "links_up": 31.0 + i,
        "job_restarted": 100.0 + i, "collectives_ready": 120.0 + i, "first_step": 900.0 + i}}
        for i in range(20)]


def shown_ticks(axis: Any, limits: tuple[float, float]) -> list[Any]:
    low, high = sorted(limits)
    return [tick for tick in axis.get_major_ticks() + axis.get_minor_ticks()
            if low <= tick.get_loc() <= high]


def problems(fig: Any) -> list[str]:
    """Text reaching past the figure's edge, and axes with fewer than two labels."""
    fig.canvas.draw()
    renderer, edge = fig.canvas.get_renderer(), fig.bbox
    found: list[str] = []
    every_tick, drawn_ticks = set(), set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            every_tick.update(id(t.label1) for t in axis.get_major_ticks()
                              + axis.get_minor_ticks())
        if not ax.axison:
            continue
        for name, axis, limits in (("x", ax.xaxis, ax.get_xlim()),
                                   ("y", ax.yaxis, ax.get_ylim())):
            ticks = shown_ticks(axis, limits)
            drawn_ticks.update(id(t.label1) for t in ticks)
            labels = [t.label1.get_text() for t in ticks
                      if t.label1.get_visible() and t.label1.get_text()]
            if len(labels) < 2:
                found.append(f"{ax.get_title()!r}: {name} axis labels {labels}")
    for text in fig.findobj(lambda a: hasattr(a, "get_text") and a.get_visible()
                            and bool(a.get_text())):
        if id(text) in every_tick and id(text) not in drawn_ticks:
            continue  # a tick beyond the axis's limits is not drawn
        box = text.get_window_extent(renderer)
        if (box.x0 < edge.x0 - 0.5 or box.y0 < edge.y0 - 0.5 or box.x1 > edge.x1 + 0.5
                or box.y1 > edge.y1 + 0.5):
            found.append(f"cut: {text.get_text()[:40]!r}")
    return found


@pytest.mark.parametrize("dpi", [50, 150, 300, 600])
def test_nothing_is_cut_and_every_axis_reads_at_any_resolution(dpi: int) -> None:
    plt = _pyplot()
    with plt.rc_context(RC):
        figures = [*reconfig_figures(a_run(), demo_like()), *failover_figures(*failover_run())]
        for stem, fig in figures:
            fig.set_dpi(dpi)
            assert problems(fig) == [], stem
            plt.close(fig)


def test_what_labd_adds_has_its_own_axis_and_batches_show_their_spread() -> None:
    plt = _pyplot()
    rows = demo_like()
    with plt.rc_context(RC):
        figures = dict(reconfig_figures(a_run(), rows))
        assert set(figures) == {"paper-cdf", "paper-added", "paper-batch"}
        added = figures["paper-added"]
        lines = {line.get_gid(): line for ax in added.axes for line in ax.lines
                 if line.get_gid()}
        # labd's time minus the truth: the 0.08 ms labd adds, for every change.
        for switch in ("mesh1", "ocs1", "ocs2", "ocs3"):
            values = lines[f"{switch}-added"].get_xdata()
            assert len(values) == 120 and all(0.07 < v < 0.09 for v in values), switch
        batch = figures["paper-batch"]
        bands = [ax for ax in batch.axes if ax.collections]
        assert len(bands) == 4  # the middle half of each batch size, per switch
        for fig in figures.values():
            plt.close(fig)
