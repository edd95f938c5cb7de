"""What the demo prints beside its tables: the machine's load in one line, and progress as
plain lines where the output is no terminal."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from labd.emulation.demo import SwitchRun, _report
from labd.emulation.readout import Load, PlainProgress, _cpu_times, progress_for


def test_the_load_note_is_one_line_and_says_when_it_is_loaded() -> None:
    quiet = Load(cpus=4, load_average=0.5, steal=0.0)
    assert quiet.note() == "During the run: load average 0.50 on 4 CPUs, CPU steal 0%"
    busy = Load(cpus=2, load_average=6.7, steal=0.0)
    assert busy.loaded and "loaded" in busy.note() and len(busy.note()) <= 132
    stolen = Load(cpus=8, load_average=1.0, steal=0.12)
    assert stolen.loaded and "CPU steal 12%" in stolen.note()
    assert Load(cpus=1).note() == "During the run: load not known"


def test_a_measured_load_is_read_from_the_system() -> None:
    load = Load.start().stop()
    assert load.cpus >= 1 and load.load_average is not None and load.load_average >= 0
    if Path("/proc/stat").exists():
        assert load.steal is not None and 0 <= load.steal <= 1


def test_cpu_times_from_a_stat_file(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 10 0 5 35 0 0\ncpu0 1 2 3\n")
    assert _cpu_times(stat) == (1000, 35)
    stat.write_text("nothing\n")
    assert _cpu_times(stat) is None
    assert _cpu_times(tmp_path / "none") is None


def test_progress_is_plain_lines_where_there_is_no_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, width=100)
    progress = progress_for(console)
    assert isinstance(progress, PlainProgress)
    with progress:
        task = progress.add_task("reconfiguring ocs1", total=8)
        for _ in range(8):
            progress.advance(task)
    lines = out.getvalue().splitlines()
    assert lines[0] == "reconfiguring ocs1: started (8 to do)"
    assert lines[1:4] == ["reconfiguring ocs1: 2/8", "reconfiguring ocs1: 4/8",
                          "reconfiguring ocs1: 6/8"]
    assert lines[4].startswith("reconfiguring ocs1: done, 8 in ") and len(lines) == 5
    assert isinstance(progress_for(Console(file=io.StringIO(), force_terminal=True)),
                      Progress)


def test_the_report_has_figures_where_there_are_some_and_a_one_line_caption() -> None:
    lit = SwitchRun("ocs1", "polatis-scpi", device_ms=[1.0, 2.0], true_ms=[1.0, 1.5],
                    overhead_ms=[0.1, 0.2], light_ms=[3.0], total_ms=[2.0, 3.0])
    dark = SwitchRun("ocs9", "polatis-scpi", device_ms=[1.0], true_ms=[1.0],
                     overhead_ms=[0.1], total_ms=[2.0])
    out = io.StringIO()
    Console(file=out, width=132).print(_report([lit, dark]))
    text = out.getvalue()
    assert "3.00 (1)" in text and "no meter" in text
    assert " - " not in text
    caption = [line for line in text.splitlines() if "device:" in line]
    assert len(caption) == 1, text
