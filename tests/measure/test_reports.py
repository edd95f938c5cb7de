"""What ``labd measure`` reports and draws from a run: plots read back from their files,
the bootstrap comparison and its verdicts, the compact summary, failures by reason, the
truth check as an exit status, and the extras checked before anything runs."""

from __future__ import annotations

import asyncio
import struct
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from labd.emulation.campaign import failover_report
from labd.measure.plots import PlotStyle, reconfig_figures, reconfig_plots
from labd.measure.reports import compare_table, failures, summary_table
from labd.measure.runs import Run, RunStore
from labd.measure.stats import compare_values, needed
from tests.commands.test_cli import run
from tests.measure.test_measure import lab_file, within

SVG = "{http://www.w3.org/2000/svg}"


def change(i: int, switch: str = "ocs1", *, device_ms: float, truth_ms: float | None = None,
           light_ms: float | None = None, k: int = 1, outcome: str = "ok",
           error: str | None = None) -> dict[str, Any]:
    """One row as a run keeps it: phases in ns, from dispatch at i s."""
    start = (i + 1) * 1_000_000_000
    acked = start + int(device_ms * 1e6)
    row: dict[str, Any] = {
        "switch": switch, "pattern": "sweep", "k": k, "round": i, "id": i, "outcome": outcome,
        "error": error, "cause": "measurement", "pairs": k,
        "phases": {"requested": start - 200_000, "dispatched": start, "activated": start,
                   "acknowledged": acked,
                   "light": None if light_ms is None else start + int(light_ms * 1e6),
                   "done": acked + 300_000}}
    if truth_ms is not None:
        row["truth_ms"] = truth_ms
    return row


def a_run(name: str = "paper", *, emulated: bool = True, timing: dict[str, Any] | None = None
          ) -> Run:
    return Run(name=name, kind="reconfig", labd_version="0", lab_name="bench",
               target="lab bench.toml (emulated)" if emulated else "http://lab:8470",
               lab_sha256="", planned=0, status="complete",
               params={"timing": timing, "emulated": emulated,
                       "switch_models": {"ocs1": "Polatis N-OST-8x8-LA1-DMHNS"}})


MODEL = {"switch_time_ms": 25, "jitter_ms": 1, "per_pair_ms": 0, "switches": ["ocs1"]}


def texts(path: Path) -> list[str]:
    """Every text element of an SVG (the plots keep text as text)."""
    return [e.text or "" for e in ET.parse(path).iter(f"{SVG}text")]


def ids(path: Path) -> set[str]:
    return {e.get("id", "") for e in ET.parse(path).iter(f"{SVG}g")}


def test_svg_plots_name_n_the_truth_and_the_conditions(tmp_path: Path) -> None:
    rows = [change(i, device_ms=25.3 + (i % 7) / 100, truth_ms=25.0 + (i % 5) / 100,
                   light_ms=26.0, k=(1, 2, 4)[i % 3]) for i in range(60)]
    cdf, added, batch = reconfig_plots(a_run(timing=MODEL), rows, tmp_path, PlotStyle("svg"))
    assert (cdf.name, added.name, batch.name) == ("paper-cdf.svg", "paper-added.svg",
                                                  "paper-batch.svg")
    assert "labd's switching time - emulator's truth (n = 60)" in texts(added)
    said = texts(cdf)
    assert "lab bench, emulated" in said and "reconfiguration times (run paper)" in said
    assert "ocs1: Polatis N-OST-8x8-LA1-DMHNS" in said and "25 ± 1 ms model" in said
    assert "labd device time (n = 60)" in said and "labd light verified (n = 60)" in said
    assert "emulator's truth (settled) (n = 60)" in said
    assert {"ocs1-device", "ocs1-light", "ocs1-truth"} <= ids(cdf)  # the series drawn
    said = texts(batch)
    assert "lab bench, emulated" in said
    assert "device time against batch size (run paper)" in said
    assert "device p50 (n = 20 per size)" in said
    # 20 values per size: the p99 is drawn hollow, and says why.
    assert "device p99 (n = 20 per size)" in said
    assert "hollow: from < 100 values, near the max" in said
    assert "emulator's truth p50 (n = 20 per size)" in said
    # The same run draws the same file, byte for byte (no dates, fixed ids).
    first = cdf.read_bytes()
    reconfig_plots(a_run(timing=MODEL), rows, tmp_path, PlotStyle("svg"))
    assert cdf.read_bytes() == first
    # Measured without the emulators: real, and no truth drawn.
    plain = [change(i, device_ms=25.3) for i in range(120)]
    [cdf] = reconfig_plots(a_run("hw", emulated=False), plain, tmp_path, PlotStyle("svg"))
    said = texts(cdf)
    assert "lab bench, real" in said and "reconfiguration times (run hw)" in said
    assert not any("truth" in t for t in said) and "labd device time (n = 120)" in said


def test_a_p99_from_enough_values_is_drawn_solid(tmp_path: Path) -> None:
    rows = [change(i, device_ms=25.3, k=(1, 2)[i % 2]) for i in range(240)]
    [_, batch] = reconfig_plots(a_run(), rows, tmp_path, PlotStyle("svg"))
    said = texts(batch)
    assert "device p99 (n = 120 per size)" in said
    assert not any("hollow" in t for t in said)


def test_formats_sizes_and_resolution(tmp_path: Path) -> None:
    rows = [change(i, device_ms=25.3, truth_ms=25.0) for i in range(20)]
    [png, _] = reconfig_plots(a_run(), rows, tmp_path, PlotStyle("png", dpi=200))
    header = png.read_bytes()
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, _ = struct.unpack(">II", header[16:24])
    assert width == 700  # one switch: a column, 3.5 in, at 200 dpi
    [pdf, _] = reconfig_plots(a_run(), rows, tmp_path, PlotStyle("pdf"))
    assert pdf.name == "paper-cdf.pdf" and pdf.read_bytes()[:5] == b"%PDF-"
    two = rows + [change(i, "ocs2", device_ms=25.3) for i in range(20)]
    [png, _] = reconfig_plots(a_run(), two, tmp_path, PlotStyle("png", dpi=100))
    assert struct.unpack(">II", png.read_bytes()[16:24])[0] == 700  # a page, 7 in


def test_legends_stay_off_the_lines_and_negative_values_stay_on_the_axis() -> None:
    # Light seen before the command's dispatch stamp: negative, and on a log axis it would
    # vanish.
    rows = [change(i, device_ms=25.0 + i / 10, light_ms=-0.4 if i % 4 else 30.0,
                   truth_ms=25.0, k=(1, 2, 4)[i % 3]) for i in range(90)]
    rows += [change(i, "ocs2", device_ms=2.0 + i, k=(1, 2, 4)[i % 3]) for i in range(30)]
    rows += [change(i, "ocs3", device_ms=25.0 + i / 100, k=(1, 2, 4)[i % 3])
             for i in range(30)]
    figures = dict(reconfig_figures(a_run(), rows))
    assert set(figures) == {"paper-cdf", "paper-added", "paper-batch"}
    for fig in figures.values():
        fig.canvas.draw()
        plotted = [ax for ax in fig.axes if ax.lines]
        legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
        assert plotted and len(legends) == len(plotted)
        for legend in legends:
            box = legend.get_window_extent()
            assert not any(box.overlaps(ax.get_window_extent()) for ax in plotted)
    cdf = [ax for ax in figures["paper-cdf"].axes if ax.lines]
    scales = {ax.get_title().split(":")[0]: ax.get_xscale() for ax in cdf}
    # Negative light: symlog; 2-31 ms: log; 25.0-25.3 ms: linear, not a crowded log axis.
    assert scales == {"ocs1": "symlog", "ocs2": "log", "ocs3": "linear"}
    light = next(line for line in cdf[0].lines if line.get_gid() == "ocs1-light")
    assert min(light.get_xdata()) == pytest.approx(-0.4)


def test_the_verdicts_say_in_words_what_the_intervals_allow() -> None:
    assert [needed(q) for q in (50, 90, 99)] == [2, 10, 100]
    slow = [30.0 + (i % 10) / 50 for i in range(200)]
    fast = [25.0 + (i % 10) / 50 for i in range(200)]
    said = compare_values(fast, slow, 50, names=("a", "b"))
    assert said.direction == 1 and said.verdict.startswith("b is slower by 5.000 ms (95 % CI ")
    assert said.low is not None and said.high is not None and 4.9 < said.low <= said.high < 5.1
    assert compare_values(slow, fast, 99, names=("a", "b")).verdict.startswith(
        "b is faster by 5.000 ms")
    same = compare_values(fast, list(reversed(fast)), 50)
    assert same.direction == 0 and same.verdict.startswith("within noise")
    # An interval clear of zero but a difference under the floor: still noise.
    nudged = compare_values(fast, [v + 0.1 for v in fast], 50, noise_ms=0.5)
    assert nudged.low is not None and nudged.low > 0
    assert nudged.verdict.startswith("within noise")
    few = compare_values(fast[:3], slow[:40], 99)
    assert few.verdict == "n = 3 and n = 40: too few for a p99 (needs 100)"
    assert few.a is None and few.b is None
    assert compare_values([], slow, 50, names=("a", "b")).verdict == "only in b"
    # Fixed seed: the same runs read the same every time.
    noisy = [25 + ((i * 7919) % 101) / 100 for i in range(150)]
    assert compare_values(fast, noisy, 99) == compare_values(fast, noisy, 99)


def test_the_summary_is_compact_and_failures_are_counted_by_reason() -> None:
    rows = [change(i, device_ms=25.0, truth_ms=24.9, k=(1, 2, 4, 8)[i % 4])
            for i in range(98)]
    rows += [change(98 + i, device_ms=25.0, outcome="failed",
                    error=f"ocs1: device refused (to ':OXC:SWIT:CONN:ADD (@{i}),(@{i + 8})'): "
                          "-222 Data out of range; the switch was put back as it was")
             for i in range(5)]
    rows += [change(103 + i, device_ms=25.0, outcome="light-missing",
                    error=f"no light on pm1:{i}") for i in range(2)]
    assert failures(rows) == ("105 reconfigurations (7 failed: 5 device refused: -222 Data "
                              "out of range, 2 light missing)")
    assert failures(rows[:3]) == "3 reconfigurations (none failed)"

    def shown(full: bool) -> list[str]:
        console = Console(width=200, record=True)
        console.print(summary_table(a_run(timing=MODEL), rows, full=full))
        return console.export_text().splitlines()

    compact = [line for line in shown(False) if line.startswith("│ ocs1")]
    # One row per figure: device, software, total, truth, excess (switching is the device
    # time on a one-command switch).
    assert len(compact) == 5 and all("1\N{EN DASH}8" in line for line in compact)
    assert "7 failed: 5 device refused" in " ".join(shown(False))
    assert "* from fewer values" in " ".join(shown(False))  # 98 values: no p99
    full = [line for line in shown(True) if line.startswith("│ ocs1")]
    assert len(full) == 4 * 6  # per batch size, switching included


def cells(out: str) -> list[list[str]]:
    """A rich table's rows as cells, a row's wrapped lines joined."""
    rows: list[list[str]] = []
    for line in out.splitlines():
        if not line.startswith("│"):
            continue
        parts = [c.strip() for c in line.strip().strip("│").split("│")]
        if rows and not parts[0]:
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], parts, strict=True)]
        else:
            rows.append(parts)
    return rows


def verdict(out: str, switch: str, figure: str) -> str:
    return next(r[-1] for r in cells(out) if r[0] == switch and r[1] == figure)


def interval(out: str, switch: str, figure: str) -> tuple[float, float]:
    """The 95 % interval of the difference a compare table gives a figure."""
    cell = next(r[-2] for r in cells(out) if r[0] == switch and r[1] == figure)
    low, high = cell.split("..")
    return float(low), float(high)


@pytest.mark.timeout(300)  # its waits together (tests/conftest.py scales it)
async def test_compare_tells_noise_from_a_slower_switch(tmp_path: Path) -> None:
    """Three real campaigns: two on a 25 ms model, one on 30 ms (no jitter: the emulators'
    fixed timing). 40 changes each put the 5 ms apart outside any interval, while the same
    model twice differs by less than the floor or the run-to-run variation."""
    lab, runs = lab_file(tmp_path), tmp_path / "runs.sqlite"
    for name, ms in (("a25", "25"), ("b25", "25"), ("c30", "30")):
        code, out, err = await run("measure", "reconfig", "--lab", str(lab), "--rounds", "40",
                                   "--switch-ms", ms, "--jitter-ms", "0", "--seed", "1",
                                   "--no-light", "--runs", str(runs), "--name", name,
                                   timeout=within(120))
        assert code == 0, out + err
    code, same, err = await run("measure", "compare", "a25", "b25", "--runs", str(runs))
    assert code == 0, same + err
    for figure in ("device p50", "truth p50"):
        assert verdict(same, "ocs1", figure) == "noise", same
    assert verdict(same, "ocs1", "device p99") == "too few"
    code, slower, err = await run("measure", "compare", "a25", "c30", "--runs", str(runs))
    assert code == 0, slower + err
    for figure in ("device p50", "truth p50"):
        assert verdict(slower, "ocs1", figure) == "slower", slower
    # The 5 ms the models are apart, as the emulator kept them; labd's own figure moves
    # with the machine's load, and its verdict is what the test holds it to.
    assert interval(slower, "ocs1", "truth p50") == (5.0, 5.0)
    assert "nan" not in same + slower
    assert "lab measured" in slower and "emulated" in slower  # the conditions in the title


def kept(runs: Path, name: str, rows: list[dict[str, Any]], timing: dict[str, Any] | None
         ) -> None:
    """A run written to the store directly, as a campaign would have kept it."""
    store = RunStore(runs)
    try:
        made = store.create(name=name, kind="reconfig", params={"timing": timing},
                            labd_version="0", target="lab bench.toml (emulated)",
                            lab_name="bench", lab_sha256="", planned=len(rows))
        for row in rows:
            store.add(made, row)
        store.finish(made, "complete")
    finally:
        store.close()


async def test_check_is_the_exit_status_of_the_truth_check(tmp_path: Path) -> None:
    runs = tmp_path / "runs.sqlite"
    timing = {"switch_time_ms": 10, "jitter_ms": 0, "per_pair_ms": 0, "switches": ["ocs1"]}
    kept(runs, "good", [change(i, device_ms=10.3, truth_ms=10.0) for i in range(100)], timing)
    # labd's times 1.5 ms over the truth: outside the 1 ms window.
    kept(runs, "bad", [change(i, device_ms=11.5, truth_ms=10.0) for i in range(100)], timing)
    kept(runs, "untimed", [change(i, device_ms=11.5) for i in range(10)], None)
    code, out, err = await run("measure", "show", "bad", "--runs", str(runs))
    assert code == 0 and "NO, NO" in out  # the table alone does not fail the command
    code, out, err = await run("measure", "show", "bad", "--runs", str(runs), "--check")
    assert code == 1, out + err
    said = " ".join(err.split())
    assert "the truth check failed: ocs1: p99 apart 1.500 ms and excess p99 1.500 ms" in said
    code, out, err = await run("measure", "show", "good", "--runs", str(runs), "--check")
    assert code == 0, out + err
    code, out, err = await run("measure", "show", "untimed", "--runs", str(runs), "--check")
    assert code == 2 and "no timing model" in err
    # Before anything runs: a campaign with --check needs a model to check against.
    code, out, err = await run("measure", "reconfig", "--lab", "demo", "--check", "--runs",
                               str(tmp_path / "none.sqlite"))
    assert code == 2 and "--check" in err and "--switch-ms" in err
    assert not (tmp_path / "none.sqlite").exists()


def test_compare_of_failover_runs_names_stages() -> None:
    def drill(i: int, kind: str = "gpu") -> dict[str, Any]:
        return {"kind": kind, "outcome": "recovered", "ms": {"detected": 10.0 + i % 3,
                                                             "first_step": 900.0 + i}}

    a = Run(name="f1", kind="failover", params={}, labd_version="0", lab_name="failover",
            target="lab failover.toml (emulated)", lab_sha256="", planned=0, status="complete")
    b = Run(name="f2", kind="failover", params={}, labd_version="0", lab_name="failover",
            target="lab failover.toml (emulated)", lab_sha256="", planned=0, status="complete")
    console = Console(width=200, record=True)
    console.print(compare_table(a, [drill(i) for i in range(5)], b,
                                [drill(i + 100) for i in range(5)]))
    out = console.export_text()
    assert verdict(out, "gpu", "first_step p50") == "slower"
    low, high = interval(out, "gpu", "first_step p50")
    assert 95 < low <= 100 <= high < 105
    assert verdict(out, "gpu", "first_step p99") == "too few"
    assert "nan" not in out


def test_the_failover_targets_judge_each_stage_on_its_own() -> None:
    """Light within the switch's time + 5 ms of the report, the report within 1 ms and its
    detection within 2 ms of the injection, the first step within 250 ms, a lost host within
    1.5 heartbeats: each judged on its own, so one miss says which."""
    def gpu(i: int, *, detected: float) -> dict[str, Any]:
        return {"kind": "gpu", "outcome": "recovered", "report_to_light_ms": 29.0 + i % 2,
                "ms": {"reported": 0.4, "detected": detected, "first_step": 240.0}}

    lost = {"kind": "host", "outcome": "recovered", "heartbeat_s": 0.5,
            "ms": {"detected": 700.0}}  # 1.4 heartbeats

    def verdicts(rows: list[dict[str, Any]]) -> dict[str, str]:
        console = Console(width=200, record=True)
        console.print(failover_report(rows, 25.0)[-1])
        lines = [line for line in console.export_text().splitlines() if "│" in line]
        return {cells[1].strip(): cells[-2].strip() for line in lines
                if len(cells := line.split("│")) > 6 and cells[1].strip() != "figure"}

    met = verdicts([*(gpu(i, detected=1.5) for i in range(5)), lost])
    assert met == {"failure report → light on every new circuit (truth), ms": "yes",
                   "GPU failure → reported, ms": "yes", "GPU failure → detected, ms": "yes",
                   "GPU failure → first step, ms": "yes",
                   "host lost → detected, heartbeat intervals": "yes"}
    slow = verdicts([*(gpu(i, detected=2.5) for i in range(5)),
                     {**lost, "ms": {"detected": 800.0}}])
    assert slow["GPU failure → detected, ms"] == "NO"
    assert slow["host lost → detected, heartbeat intervals"] == "NO"
    assert slow["GPU failure → reported, ms"] == "yes"
    late = verdicts([{**gpu(0, detected=1.0), "report_to_light_ms": 30.5}])
    assert late["failure report → light on every new circuit (truth), ms"] == "NO"


@pytest.mark.parametrize(("option", "package", "module"), [
    ("--plots", "matplotlib", "matplotlib"), ("--parquet", "pyarrow", "pyarrow")])
async def test_a_missing_extra_is_refused_before_the_campaign(
        tmp_path: Path, option: str, package: str, module: str) -> None:
    """As without the ``measure`` extra: the package cannot be imported in that process."""
    lab, runs = lab_file(tmp_path), tmp_path / "runs.sqlite"
    argv = ["labd", "measure", "reconfig", "--lab", str(lab), "--rounds", "2", "--runs",
            str(runs), option, str(tmp_path / "out")]
    program = (f"import sys; sys.modules[{module!r}] = None; sys.argv = {argv!r}; "
               "from labd.commands.main import main; main()")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", program, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    async with asyncio.timeout(within(60)):
        out, err = await proc.communicate()
    said = " ".join((out + err).decode().split())
    assert proc.returncode == 2, said
    assert f"{option} needs {package}, which is not installed" in said
    assert "pip install 'labd[measure]'" in said and "Traceback" not in said
    assert not runs.exists()  # refused before the run was made, let alone measured


async def test_a_bad_plot_format_is_one_message(tmp_path: Path) -> None:
    code, out, err = await run("measure", "show", "any", "--runs", str(tmp_path / "r.sqlite"),
                               "--plots", str(tmp_path), "--format", "gif")
    assert code == 2 and "plot format 'gif': expected one of png, svg, pdf" in err
    code, out, err = await run("measure", "show", "any", "--plots", str(tmp_path), "--dpi",
                               "10")
    assert code == 2 and "--dpi" in out + err


def test_a_long_title_is_wrapped_inside_its_figure() -> None:
    # A column-wide schedule figure once cut its run's and schedule's names at both ends.
    from labd.measure.plots import schedule_figures

    run = a_run("schedule-20261203-063317")
    run.params["schedule"] = "3d-pp2-dp2-tp2-mb4-l2-with-a-long-name"
    rows = [{"mode": mode, "changed": ["ocs1"], "gap_ms": 8.0, "reconfig_ms": 4.0,
             "hidden": mode == "speculative"} for mode in ("on demand", "speculative")]
    [(_, fig)] = schedule_figures(run, rows)
    from matplotlib.text import Text

    fig.canvas.draw()
    [title] = [t for t in fig.findobj(Text) if t.get_text() == fig.get_suptitle()]
    box = title.get_window_extent()
    assert box.x0 >= 0 and box.x1 <= fig.bbox.width, (box, fig.bbox)
    assert "schedule-20261203-063317" in title.get_text()
    assert "3d-pp2-dp2-tp2-mb4-l2-with-a-long-name" in title.get_text()
