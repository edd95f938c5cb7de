"""scripts/bench_all.py: one run of every benchmark, its results file, the comparison with an
earlier one and the generated section of docs/benchmarks.md. Nothing here asserts on a
figure's size: only that each is there, and how it is set beside its target and its past."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "bench_all.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_all", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_all"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench_all = load()


def bench(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def results(commit: str, figures: dict[str, dict[str, float]]) -> dict[str, Any]:
    """A results file as bench_all writes one, by hand."""
    return {"schema": 1, "commit": commit, "date": "2026-12-01T10:00:00Z",
            "machine": {"os": "Linux", "arch": "x86_64", "python": "3.11.7", "cpu_count": 2,
                        "cpu_model": None, "memory_gib": 8.0, "loop": "uvloop 0.23.0"},
            "quick": False, "sizes": {}, "seconds": {}, "benchmarks": figures, "errors": {}}


def write(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# Every benchmark at its --quick sizes: about 30 s on 2 cores.
@pytest.mark.timeout(150)
def test_a_quick_run_writes_the_machine_the_commit_and_every_benchmarks_figures(
        tmp_path: Path) -> None:
    out = tmp_path / "results.json"
    run = bench("--quick", "--out", str(out), timeout=400)
    assert run.returncode == 0, run.stderr
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["schema"] == 1 and data["quick"] is True
    assert re.fullmatch(r"[0-9a-f]{7,}(\+dirty)?", data["commit"])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["date"])
    machine = data["machine"]
    assert machine["cpu_count"] >= 1 and machine["python"].count(".") == 2
    assert machine["loop"].split()[0] in ("uvloop", "asyncio") and machine["os"]
    assert not data["errors"]
    assert set(data["benchmarks"]) == {b.name for b in bench_all.BENCHMARKS}
    for figure in bench_all.FIGURES:
        value = data["benchmarks"][figure.benchmark][figure.key]
        assert isinstance(value, int | float), figure.key
    assert [(v["benchmark"], v["figure"]) for v in data["verdicts"]] == [
        (f.benchmark, f.key) for f in bench_all.FIGURES]
    assert all(v["verdict"] for v in data["verdicts"])
    # One table, and nothing that names this machine's paths.
    assert run.stdout.count("verdict") == 1 and "targets met:" in run.stdout
    assert str(ROOT) not in run.stdout + out.read_text(encoding="utf-8")


def test_verdicts_against_fixed_targets_a_stretch_and_another_figure() -> None:
    by_key = {f.key: f for f in bench_all.FIGURES}
    verdict = bench_all.verdict
    assert verdict(by_key["ratio_p50"], {"ratio_p50": 1.1}) == (True, "met, stretch met")
    assert verdict(by_key["ratio_p50"], {"ratio_p50": 1.2}) == (
        True, "met, stretch missed by 0.050")
    assert verdict(by_key["ratio_p50"], {"ratio_p50": 1.5}) == (False, "missed by 0.200")
    assert verdict(by_key["store_rows_per_s"], {"store_rows_per_s": 31_000}) == (
        False, "missed by 9,000 rows/s")
    assert verdict(by_key["truth_inside"], {"truth_inside": 10, "truth_total": 10}) == (
        True, "met")
    assert verdict(by_key["truth_inside"], {"truth_inside": 9, "truth_total": 10}) == (
        False, "missed by 1")
    assert verdict(by_key["raw_p50_us"], {"raw_p50_us": 100.0}) == (None, "no target")
    assert bench_all.target_text(by_key["raw_p50_us"]) == "\u2013"
    assert bench_all.target_text(by_key["ratio_p50"]) == "≤ 1.3 (stretch ≤ 1.15)"


def test_against_an_earlier_file_adds_before_and_the_change_and_which_way_is_better(
        tmp_path: Path) -> None:
    before = write(tmp_path / "before.json", results("1111111", {
        "bench_switch": {"ratio_p50": 1.5, "driver_p50_us": 200.0},
        "bench_daemon": {"store_rows_per_s": 40_000, "api_added_p50_ms": 0.4}}))
    now = results("2222222", {
        "bench_switch": {"ratio_p50": 1.2, "driver_p50_us": 200.0, "raw_p50_us": 150.0},
        "bench_daemon": {"store_rows_per_s": 50_000, "api_added_p50_ms": 0.6}})
    rows = {cells[1]: cells for cells in
            bench_all.table_rows(now, bench_all.load_results(before))}
    labels = {f.key: f.label for f in bench_all.FIGURES}
    # Columns: benchmark, figure, value, unit, target, verdict, before, change.
    assert rows[labels["ratio_p50"]][6:] == ["1.50", "-0.300 (-20 %), better"]
    assert rows[labels["store_rows_per_s"]][6:] == ["40,000", "+10,000 (+25 %), better"]
    assert rows[labels["api_added_p50_ms"]][6:] == ["0.400", "+0.200 (+50 %), worse"]
    assert rows[labels["driver_p50_us"]][6:] == ["200.0", "no change"]
    assert rows[labels["raw_p50_us"]][6:] == ["\u2013", "\u2013"]  # not measured before

    # The same from the command line, on the results file instead of a run.
    run = bench("--from", str(write(tmp_path / "now.json", now)), "--against", str(before))
    assert run.returncode == 0, run.stderr
    assert "before" in run.stdout and "change" in run.stdout
    assert "+10,000 (+25 %), better" in run.stdout and "commit 1111111" in run.stdout


@pytest.mark.parametrize(("content", "why"), [
    ("not json at all\n", "not JSON"),
    ("[1, 2]", "not a JSON object"),
    (json.dumps({"schema": 1, "benchmarks": {"bench_switch": {"ratio_p50": "fast"}}}),
     "not an object of numbers"),
    (None, "no such file"),
])
def test_a_bad_against_file_is_one_line_naming_it_and_exit_2(
        tmp_path: Path, content: str | None, why: str) -> None:
    path = tmp_path / "previous.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    run = bench("--against", str(path), "--only", "light")
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1 and str(path) in run.stderr and why in run.stderr
    assert "Traceback" not in run.stderr and not run.stdout  # refused before any run


def test_docs_regenerates_one_section_between_the_markers(tmp_path: Path) -> None:
    docs = tmp_path / "benchmarks.md"
    original = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    docs.write_text(original, encoding="utf-8")
    head, _, rest = original.partition(bench_all.BEGIN)
    _, _, tail = rest.partition(bench_all.END)
    first = write(tmp_path / "first.json", results("abcdef1", {
        "bench_switch": {"ratio_p50": 1.2}}))
    second = write(tmp_path / "second.json", results("abcdef2+dirty", {
        "bench_switch": {"ratio_p50": 1.4}, "bench_light": {"ocs1_p99_abs_us": 30.0}}))

    for source in (first, second, second):
        assert bench_all.main(["--from", str(source), "--docs", "--docs-file", str(docs)]) == 0
        text = docs.read_text(encoding="utf-8")
        assert text.count(bench_all.BEGIN) == 1 and text.count(bench_all.END) == 1
        # The hand-written text around the section stays as it was.
        assert text.startswith(head + bench_all.BEGIN) and text.endswith(bench_all.END + tail)
    assert "commit abcdef2+dirty, 2026-12-01 10:00 UTC" in text and "abcdef1" not in text
    assert "| bench_switch | driver / raw socket round trip, p50 | 1.40 |" in text
    assert "|  | OCS \\|detected - true\\|, p99 | 30.0 | µs | ≤ 1,000 µs | met |" in text
    assert "2 CPUs, Python 3.11.7, uvloop 0.23.0" in text
    once = text
    bench_all.main(["--from", str(second), "--docs", "--docs-file", str(docs)])
    assert docs.read_text(encoding="utf-8") == once


def test_docs_without_the_markers_is_refused_before_anything_runs(tmp_path: Path) -> None:
    docs = tmp_path / "plain.md"
    docs.write_text("# Benchmarks\n", encoding="utf-8")
    run = bench("--docs", "--docs-file", str(docs), "--only", "light")
    assert run.returncode == 2 and str(docs) in run.stderr and "bench_all:begin" in run.stderr
    assert not run.stdout


def test_check_fails_a_missed_target_and_a_plain_run_does_not(tmp_path: Path) -> None:
    daemon = {"api_added_p50_ms": 0.3, "store_rows_per_s": 50_000, "lag_p99_ms": 1.0,
              "fleet_per_s": 9_000, "truth_inside": 10, "truth_total": 10,
              "fleet_one_cpu_per_s": 9_500, "fleet_one_cpu_truth_inside": 12,
              "fleet_one_cpu_truth_total": 12}
    met = write(tmp_path / "met.json", results("abcdef1", {"bench_daemon": daemon}))
    missed = write(tmp_path / "missed.json", results("abcdef1", {
        "bench_daemon": daemon | {"truth_inside": 9}}))
    assert bench_all.main(["--from", str(missed)]) == 0
    assert bench_all.main(["--from", str(missed), "--check"]) == 1
    assert bench_all.main(["--from", str(met), "--check"]) == 0


def test_a_failed_benchmark_is_in_the_table_and_the_file_and_exits_1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def run_one(bench: Any, sizes: Any, verbose: bool) -> dict[str, float]:
        if bench.name == "bench_mesh":
            raise bench_all.BenchmarkFailed("exit status 1: RuntimeError: [no pty]")
        return {"ratio_p50": 1.2} if bench.name == "bench_switch" else {}

    monkeypatch.setattr(bench_all, "run_one", run_one)
    out = tmp_path / "results.json"
    assert bench_all.main(["--only", "switch,mesh", "--out", str(out)]) == 1
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["errors"] == {"bench_mesh": "exit status 1: RuntimeError: [no pty]"}
    assert data["benchmarks"] == {"bench_switch": {"ratio_p50": 1.2}}
    assert set(data["sizes"]) == {"bench_switch", "bench_mesh"}
    failed = [cells for cells in bench_all.table_rows(data) if cells[0] == "bench_mesh"]
    assert failed == [["bench_mesh", "failed", "\u2013", "", "\u2013",
                       "exit status 1: RuntimeError: [no pty]"]]
    assert "RuntimeError: [no pty]" in capsys.readouterr().out  # printed as text, not markup
