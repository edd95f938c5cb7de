"""How long the TUI's port map takes to apply a full-map change on a 384x384 switch.

A daemon runs on an emulated Polatis 384x384 (zero switch time); the TUI runs headless
(Textual's test harness) against it. Each round replaces the switch's whole map with a new
random permutation through the API; the TUI gets the reconfiguration event, reads the 768
ports and redraws the map. Printed: the redraw time and the time from the API's answer to
the map showing the new partners. Target: a full-map update under 100 ms (10 updates/s).

``--matrix`` times the Matrix tab's drawing instead (tui/matrix.py, no daemon): a 384x384
switch with every ingress paired and lit, in a headless app of ``--size`` (200x50 by
default). A frame is every line the view shows drawn once (its Line API ``render_line``),
as Textual asks for them after a change; printed per case: p50 and p99 per frame. Cases:
the whole map opened, zoomed out (8 ports a cell), zoomed in (3 columns a cell), and
scrolled (the cursor stepping diagonally across, the view following it, a frame per step).

    python scripts/bench_tui.py [--rounds 20] [--gap 0.3]
    python scripts/bench_tui.py --matrix [--frames 50] [--size 200x50]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
from pathlib import Path

import httpx
from textual.app import App, ComposeResult

from labd.emulation.rig import emulated_rig
from labd.lab.loader import load_lab
from labd.vocabulary import percentile
from tui.app import LabApp
from tui.matrix import Grid, MatrixView

LAB = """[lab]
name = "benchtui"
[[instrument]]
id = "big"
driver = "polatis-scpi"
emulate = true
size = "384x384"
[instrument.emulator]
technology = "ideal"
switch_time_ms = 0
jitter_ms = 0
"""


async def main(rounds: int, gap: float) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "lab.toml"
        path.write_text(LAB)
        lab = load_lab(path)
        async with emulated_rig(lab, db=str(Path(scratch) / "s.sqlite"), mqtt=None,
                                token="t") as rig:
            app = LabApp(rig.daemon.url, "t")
            async with app.run_test(size=(160, 50)):
                await asyncio.wait_for(app.synced.wait(), 30)
                app.render_ms.clear()
                rng = random.Random(1)
                shown: list[float] = []
                async with httpx.AsyncClient(base_url=rig.daemon.url, timeout=30,
                                             headers={"Authorization": "Bearer t"}) as api:
                    for _ in range(rounds):
                        # Apart by more than the UI's refresh limit: each change is shown
                        # as a lone one would be (a stream is paced at REFRESH_S).
                        await asyncio.sleep(gap)
                        egress = rng.sample(range(385, 769), 384)
                        pairs = [[i + 1, e] for i, e in enumerate(egress)]
                        r = await api.put("/v1/switches/big/connections",
                                          json={"pairs": pairs, "verify_light": False})
                        r.raise_for_status()
                        answered = time.perf_counter()
                        want = str(egress[0])

                        def shows_it(want: str = want) -> bool:
                            row = app.query_one("#portmap").get_row("big:1")  # type: ignore[attr-defined]
                            return str(row[2]) == want

                        async with asyncio.timeout(30), app.applied:
                            while not shows_it():
                                await app.applied.wait()
                        shown.append((time.perf_counter() - answered) * 1000)
                draws = app.render_ms
                print(f"384x384 port map (768 rows), {rounds} full-map changes:")
                print(f"  redraw:                 p50 {percentile(draws, 50):6.1f} ms, "
                      f"p99 {percentile(draws, 99):6.1f} ms, max {max(draws):6.1f} ms")
                print(f"  API answer -> on screen: p50 {percentile(shown, 50):6.1f} ms, "
                      f"p99 {percentile(shown, 99):6.1f} ms (includes reading 768 ports "
                      "through the API)")
                ok = percentile(draws, 50) < 100
                print(f"  target: a full-map update under 100 ms: {'met' if ok else 'NOT met'}")


def big_grid(seed: int = 1) -> Grid:
    """A 384x384 switch as ``GET /v1/switches/{id}/ports`` would give it: every ingress
    paired with a random egress, powers spread over lit, weak and dark, a circuit on each."""
    rng = random.Random(seed)
    egress = rng.sample(range(385, 769), 384)
    partner = {i + 1: e for i, e in enumerate(egress)} | {e: i + 1 for i, e in enumerate(egress)}
    ports = [{"port": p, "partner": partner[p], "state": "enabled",
              "power_dbm": rng.choice([-3.0, -20.0, -45.0])} for p in range(1, 769)]
    circuits = {f"big:{p}": f"h{p}.nic0 → h{partner[p]}.nic0" for p in range(1, 385)}
    return Grid.of("big", ports, "384x384", circuits)


class MatrixBench(App[None]):
    def compose(self) -> ComposeResult:
        yield MatrixView(id="m")


def frame(view: MatrixView) -> float:
    """One frame: every line in view drawn; its time in ms."""
    started = time.perf_counter()
    for y in range(view.scrollable_content_region.height):
        view.render_line(y)
    return (time.perf_counter() - started) * 1000


async def bench_matrix(frames: int, size: tuple[int, int]) -> None:
    built = []
    for seed in range(5):
        started = time.perf_counter()
        grid = big_grid(seed)
        built.append((time.perf_counter() - started) * 1000)
    app = MatrixBench()
    async with app.run_test(size=size) as pilot:
        view = app.query_one(MatrixView)
        view.show(grid)
        await pilot.pause()
        region = view.scrollable_content_region
        print(f"384x384 matrix (147,456 cells, 384 pairs), {region.width}x{region.height} "
              f"view, {frames} frames per case:")
        print(f"  {'grid from 768 ports:':40} p50 {percentile(built, 50):6.2f} ms")
        results: dict[str, list[float]] = {}

        async def case(name: str, zoom: int, step: bool = False) -> None:
            view.zoom = zoom
            view.action_jump(0)
            await pilot.pause()
            times = []
            for _ in range(frames):
                if step:
                    view.action_move(3, 3)  # the view follows the cursor
                times.append(frame(view))
            results[name] = times

        await case("whole map (1 port, 2 columns a cell)", 4)
        await case("zoomed out (8 ports a cell)", 0)
        await case("zoomed in (3 columns a cell)", 5)
        await case("scrolled (a frame per cursor step)", 4, step=True)
        for name, times in results.items():
            print(f"  {name + ':':40} p50 {percentile(times, 50):6.2f} ms, "
                  f"p99 {percentile(times, 99):6.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--gap", type=float, default=0.3,
                        help="seconds between changes (default 0.3, above the UI's 0.2 s "
                             "refresh limit)")
    parser.add_argument("--matrix", action="store_true",
                        help="time the Matrix tab's drawing of a 384x384 switch instead")
    parser.add_argument("--frames", type=int, default=50, help="frames per case (--matrix)")
    parser.add_argument("--size", default="200x50", help="terminal size (--matrix)")
    args = parser.parse_args()
    if args.matrix:
        width, _, height = args.size.partition("x")
        asyncio.run(bench_matrix(args.frames, (int(width), int(height))))
    else:
        asyncio.run(main(args.rounds, args.gap))
