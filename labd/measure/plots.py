"""PNG plots of measurement runs (matplotlib, drawn off-screen): latency CDFs, latency
against batch size, failover stage stacks and schedule windows against reconfiguration
time. Each function writes its files under a folder and returns their paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from labd.errors import LabdError


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise LabdError("plots need matplotlib: pip install 'labd[measure]'") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def reconfig_plots(name: str, rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """``<name>-cdf.png``: each switch's device and light times as CDFs; and where a run
    has several batch sizes, ``<name>-batch.png``: p50 and p99 against batch size."""
    from labd.measure.reconfig import row_values, summarise

    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    series: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        if row.get("outcome") == "ok":
            for figure, value in row_values(row).items():
                if figure in ("device", "light") and value > 0:
                    series.setdefault((row["switch"], figure), []).append(value)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (switch, figure), values in sorted(series.items()):
        ordered = sorted(values)
        fraction = [(i + 1) / len(ordered) for i in range(len(ordered))]
        ax.step(ordered, fraction, where="post", label=f"{switch} {figure}",
                linestyle="-" if figure == "device" else "--")
    ax.set_xscale("log")
    ax.set_xlabel("ms after the command was dispatched")
    ax.set_ylabel("fraction of reconfigurations")
    ax.set_title(f"{name}: device (acknowledged) and light (verified) times")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(folder / f"{name}-cdf.png")
    fig.savefig(written[-1], dpi=110)
    plt.close(fig)

    summary = summarise(rows)
    sizes: dict[str, list[int]] = {}
    for switch, k, figure in summary:
        if figure == "device":
            sizes.setdefault(switch, []).append(k)
    if any(len(ks) > 1 for ks in sizes.values()):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for switch, ks in sorted(sizes.items()):
            ks = sorted(ks)
            line = ax.plot(ks, [summary[(switch, k, "device")]["p50"] for k in ks],
                           marker="o", label=f"{switch} p50")
            ax.plot(ks, [summary[(switch, k, "device")]["p99"] for k in ks], marker="^",
                    linestyle="--", color=line[0].get_color(), label=f"{switch} p99")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("pairs per reconfiguration (batch size)")
        ax.set_ylabel("device time, ms")
        ax.set_title(f"{name}: latency against batch size")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        written.append(folder / f"{name}-batch.png")
        fig.savefig(written[-1], dpi=110)
        plt.close(fig)
    return written


def schedule_plots(name: str, rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """``<name>-windows.png``: each window that needed a reconfiguration, its idle time
    against the reconfiguration's; below the diagonal, hidden (when started at the
    window's beginning)."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    top = 0.0
    for mode, marker in (("on demand", "x"), ("speculative", "o")):
        mine = [r for r in rows if r["mode"] == mode and r["changed"]]
        if not mine:
            continue
        gaps = [r["gap_ms"] for r in mine]
        took = [r["reconfig_ms"] for r in mine]
        top = max(top, *gaps, *took)
        hidden = sum(1 for r in mine if r["hidden"]) / len(mine) * 100
        ax.scatter(gaps, took, marker=marker, alpha=0.6,
                   label=f"{mode}: {hidden:.0f} % hidden")
    ax.plot([0, top], [0, top], color="grey", linestyle=":", label="window = reconfiguration")
    ax.set_xlabel("idle window before the phase (schedule), ms")
    ax.set_ylabel("reconfiguration, request → answer, ms")
    ax.set_title(f"{name}: schedule windows against reconfiguration time")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / f"{name}-windows.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


#: A recovery's steps, each from the stage before: (label, stage reached).
STEPS = (("detect", "detected"), ("choose a spare", "spare_chosen"),
         ("switch", "switches_acked"), ("links up", "links_up"),
         ("restart", "job_restarted"), ("collectives", "collectives_ready"),
         ("first step", "first_step"))


def failover_plots(name: str, rows: list[dict[str, Any]], folder: Path) -> list[Path]:
    """``<name>-stages.png``: each drill's recovery as a stack of its steps (ms after the
    failure), GPU failures then lost hosts."""
    plt = _pyplot()
    folder.mkdir(parents=True, exist_ok=True)
    drills = [r for r in rows if "first_step" in r["ms"]]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    for position, row in enumerate(drills):
        previous = 0.0
        for index, (label, stage) in enumerate(STEPS):
            at = row["ms"].get(stage)
            if at is None or at < previous:
                continue  # light can come before the switch says done: drawn in order
            ax.bar(position, at - previous, bottom=previous, color=f"C{index}",
                   label=label if position == 0 else None, width=0.8)
            previous = at
    ax.set_xlabel("drill (GPU failures, then hosts lost)")
    ax.set_ylabel("ms after the failure")
    ax.set_title(f"{name}: recovery stage by stage")
    ax.legend(fontsize=8, ncol=4)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path = folder / f"{name}-stages.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
