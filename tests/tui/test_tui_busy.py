"""The terminal UI in a busy lab and at 80x24, driven by Textual's pilot against a daemon
on an emulated lab: the Events tab opens on the lab's history, shows each event once and
can hide a kind; the failover stages read in time order; a change this lab cannot take is
off, with why, before anything is asked; a daemon that cannot be reached says so."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st
from textual.pilot import Pilot
from textual.widgets import DataTable, Input, Label

from labd.emulation.rig import Rig
from labd.vocabulary import STAGES
from tests.rigs import Background, background_rig
from tests.tui.screen import screen_lines, shows_whole
from tests.tui.test_tui import LAB, until
from tui.app import LabApp
from tui.screens.confirm import ConfirmScreen
from tui.screens.form import FormScreen
from tui.tabs.events import Wanted
from tui.tabs.failover import in_time_order

#: The footer at 80 columns: every key it holds, whole.
FOOTER = "q Quit c Circuit x Break m Measure d Drill / Filter r Resync ? Help"


@contextlib.asynccontextmanager
async def small(tmp_path: Path, tag: str, body: str = LAB, before: object = None
                ) -> AsyncIterator[tuple[Background, LabApp, Pilot[None]]]:
    """The UI at 80x24 on a daemon on an emulated lab (``before`` run on it first),
    synced from its first snapshot."""
    with background_rig(tmp_path, tag, body) as rig:
        if before is not None:
            await rig.call(before)  # type: ignore[arg-type]
        app = LabApp(rig.daemon.url, "t")
        async with app.run_test(size=(80, 24)) as pilot:
            async with asyncio.timeout(15):
                await app.synced.wait()
            yield rig, app, pilot


async def three_reconfigurations(rig: Rig) -> None:
    engine = rig.daemon.engine
    await engine.reconfigure("ocs1", connect=[(2, 10)])
    await engine.reconfigure("ocs1", connect=[(3, 11)])
    await engine.reconfigure("mesh1", connect=[(1, 6)])


def reconfiguration_lines(app: LabApp) -> list[str]:
    return [line.plain for _, kind, line in app.events.lines if kind == "reconfiguration"]


async def test_events_open_on_the_history_and_show_each_event_once(tmp_path: Path) -> None:
    async with small(tmp_path, "busy1", before=three_reconfigurations) as (rig, app, pilot):
        # Made before the UI attached: on the Events tab as it opens, oldest first.
        told = reconfiguration_lines(app)
        assert len(told) == 3, told
        for line, said in zip(told, ("ocs1: connected 2→10", "ocs1: connected 3→11",
                                     "mesh1: connected 1→6"), strict=True):
            assert said in line, told
        stamps = [stamp for stamp, _, _ in app.events.lines]
        assert stamps == sorted(stamps)
        await pilot.press("5")
        assert sum("reconfiguration #" in line for line in app.events.shown()) == 3
        # One more, live: shown once.
        await rig.call(lambda r: r.daemon.engine.reconfigure("ocs1", connect=[(4, 12)]))
        await until(app, lambda: len(reconfiguration_lines(app)) == 4)
        # A resync lists the history again: nothing shows twice.
        app.synced.clear()
        await pilot.press("r")
        async with asyncio.timeout(15):
            await app.synced.wait()
        assert len(reconfiguration_lines(app)) == 4
        ids = [line.rsplit("#", 1)[1] for line in reconfiguration_lines(app)]
        assert len(set(ids)) == 4
        # The same event delivered twice (by its number in the stream) is one line.
        event = {"seq": 10**6, "kind": "warning", "data": {"detail": "twice told"}}
        app.events.add_event(event)
        app.events.add_event(dict(event))
        assert sum("twice told" in line for line in app.events.shown()) == 1


async def test_a_filter_hides_a_kind(tmp_path: Path) -> None:
    async def busy(rig: Rig) -> None:
        for i in range(20):
            rig.daemon.hub.publish("job.progress", {"job": "ring4", "step": i})
        rig.daemon.hub.publish("warning", {"detail": "the one that matters"})

    async with small(tmp_path, "busy2") as (rig, app, pilot):
        await rig.call(busy)
        await until(app, lambda: any("the one that matters" in line
                                     for line in app.events.shown()))
        assert sum(k == "job.progress" for _, k, _ in app.events.lines) == 20
        await pilot.press("5", "slash", *"-job.progress")
        assert app.query_one("#event-filter", Input).value == "-job.progress"
        shown = app.events.shown()
        assert not any("job.progress" in line for line in shown)
        assert any("the one that matters" in line for line in shown)
        # Hidden, not forgotten: a new filter shows them again.
        app.query_one("#event-filter", Input).value = "job.progress"
        await pilot.pause()
        assert len(app.events.shown()) == 20
        # The lines are wrapped at 80 columns, not cut.
        app.query_one("#event-filter", Input).value = "-job."
        await pilot.press("enter")  # back to the log: the keys are the app's again
        lines = screen_lines(app.export_screenshot())
        assert shows_whole(lines, "warning the one that matters")
        assert shows_whole(lines, FOOTER), lines[-1]


@given(st.text(alphabet="abcdefghij.- ", max_size=30),
       st.sampled_from(["job.progress", "reconfiguration", "warning", "gpu.health"]),
       st.text(alphabet="abcdefghij. ", max_size=40))
def test_a_filter_never_shows_a_hidden_kind(typed: str, kind: str, said: str) -> None:
    wanted = Wanted(typed)
    hidden = [w[1:] for w in typed.lower().split() if w.startswith("-") and len(w) > 1]
    line = f"12:00:00.000 {kind:16} {said}"
    if any(kind.startswith(w) for w in hidden):
        assert not wanted(kind, line)
    if not typed.split():
        assert not wanted and wanted(kind, line)


def test_stages_in_time_order() -> None:
    """Measured on the demo: the switches acknowledged at 36.30 ms, the light verified at
    30.39 ms; the table reads in time, the stages not reached last."""
    offsets: dict[str, float | None] = dict.fromkeys(STAGES)
    offsets.update(failure=0.0, reported=0.7, detected=3.8, spare_chosen=4.3,
                   switches_acked=36.30, light_verified=30.39, links_up=38.0)
    order = in_time_order(offsets)
    assert order.index("light_verified") < order.index("switches_acked")
    assert order[:7] == ["failure", "reported", "detected", "spare_chosen",
                         "light_verified", "switches_acked", "links_up"]
    assert order[7:] == ["job_restarted", "collectives_ready", "first_step"]
    assert sorted(order) == sorted(STAGES)


async def test_the_failover_tab_lists_stages_in_time_order(tmp_path: Path) -> None:
    from tests.tui.test_tui_snapshots import _history

    async with small(tmp_path, "busy3", before=_history) as (_, app, pilot):
        await pilot.press("3")
        table = app.query_one("#timeline", DataTable)
        rows = [str(table.get_row_at(i)[0]) for i in range(table.row_count)]
        times = [float(str(table.get_row_at(i)[1])) for i in range(table.row_count)]
        assert times == sorted(times)
        assert rows.index("light_verified") < rows.index("switches_acked")


async def test_a_drill_this_lab_cannot_run_is_off_with_why(tmp_path: Path) -> None:
    async with small(tmp_path, "busy4") as (_, app, pilot):
        # The daemon says why (its hosts are not emulated), before anything is asked.
        drills = await app.client.get("/v1/drills")
        assert drills["failover"]["available"] is False
        reason = drills["failover"]["reason"]
        assert "emulated" in reason and app.unable == {"drill": reason}
        assert app.check_action("drill", ()) is None  # dimmed in the footer
        await pilot.press("d")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert app.changes.last_notice == f"d is off: {reason}"
        # The Failover tab and the help say it too.
        await pilot.press("3")
        title = str(app.query_one("#failover-title", Label).render())
        assert title == f"no failover yet; d is off here: {reason}"
        await pilot.press("question_mark")
        assert str(app.screen.query_one("#help-off", Label).render()) == \
            f"Off here: d (drill): {reason}"
        await pilot.press("escape")
        assert shows_whole(screen_lines(app.export_screenshot()), FOOTER)


async def test_a_daemon_that_cannot_be_reached(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}"
    app = LabApp(url, "t")
    async with app.run_test(size=(80, 24)) as pilot:
        async with asyncio.timeout(15):
            await app.stale.wait()
        await pilot.pause()
        assert (app.title, app.sub_title) == ("labd", "daemon not reachable")
        said = app.banner.text
        assert said.startswith(f"Daemon not reachable at {url}: ") and "labd run" in said
        assert "labd tui URL" in said
        lines = screen_lines(app.export_screenshot())
        assert "labd — daemon not reachable" in lines[0]  # the title, whole
        assert shows_whole(lines, said) and shows_whole(lines, FOOTER)
        # Every change is off, and says why at once.
        assert set(app.unable) == {"circuit", "pair", "break", "measure", "drill"}
        await pilot.press("c")
        await pilot.pause()
        assert not isinstance(app.screen, FormScreen)
        assert app.changes.last_notice == f"c is off: the daemon at {url} is not reachable"


async def test_a_lost_daemon_is_named_in_the_banner(tmp_path: Path) -> None:
    with background_rig(tmp_path, "busy5", LAB) as rig:
        app = LabApp(rig.daemon.url, "t")
        async with app.run_test(size=(80, 24)) as pilot:
            async with asyncio.timeout(15):
                await app.synced.wait()
            assert not app.banner.text and not app.unable.get("circuit")
            await rig.call(lambda r: r.daemon.stop())  # the daemon goes away
            async with asyncio.timeout(15):
                await app.stale.wait()
            await pilot.pause()
            assert app.sub_title.startswith("STALE since ")
            assert app.banner.text.startswith(f"Daemon not reachable at {rig.daemon.url} "
                                              "since ")
            assert "last picture is kept" in app.banner.text
            assert shows_whole(screen_lines(app.export_screenshot()), FOOTER)


async def test_form_fields_keep_their_labels_once_filled(tmp_path: Path) -> None:
    async with small(tmp_path, "busy6") as (_, app, pilot):
        await pilot.press("m")
        assert isinstance(app.screen, FormScreen)
        labels = {str(label.id): str(label.render())
                  for label in app.screen.query(".field-label").results(Label)}
        assert labels == {"switch-label": "Switch",
                          "pattern-label": "Pattern: toggle, random, permutation or sweep",
                          "rounds-label": "Rounds: reconfigurations per batch size",
                          "k-label": "k: pairs per batch (random)"}
        # Filled in (toggle, 20, 1), each field still says what it is.
        lines = screen_lines(app.export_screenshot())
        for text in labels.values():
            assert shows_whole(lines, text)
        assert [app.screen.query_one(f"#{i}", Input).value for i in
                ("pattern", "rounds", "k")] == ["toggle", "20", "1"]
        await pilot.press("escape")


async def test_the_ports_tab_shows_what_a_client_holds(tmp_path: Path) -> None:
    import httpx

    async with small(tmp_path, "holds") as (rig, app, pilot):
        assert not app.query_one("#holds").display  # nothing held: no line
        async with httpx.AsyncClient(base_url=rig.daemon.url,
                                     headers={"Authorization": "Bearer t"}) as http:
            made = await http.post("/v1/holds", json={
                "switch": "ocs1", "ports": [1, 9], "holder": "alice: scan 42", "ttl_s": 60})
            assert made.status_code == 201, made.text
            app.synced.clear()
            await pilot.press("r")
            async with asyncio.timeout(15):
                await app.synced.wait()
            await until(app, lambda: app.query_one("#holds").display)
            lines = screen_lines(app.export_screenshot())
            assert any("held: ocs1 1, 9 by alice: scan 42" in line for line in lines), lines
            (await http.delete(f"/v1/holds/{made.json()['id']}")).raise_for_status()
        app.synced.clear()
        await pilot.press("r")
        async with asyncio.timeout(15):
            await app.synced.wait()
        await until(app, lambda: not app.query_one("#holds").display)
