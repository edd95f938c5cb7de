"""The terminal UI driven by Textual's pilot against a daemon on an emulated lab (real
sockets, the real API and event stream; the daemon on a loop of its own, tests/rigs.py)."""

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
from textual.pilot import Pilot
from textual.widgets import (
    DataTable,
    Input,
    Label,
    OptionList,
    RichLog,
    Static,
    TabbedContent,
)

from labd.emulation.rig import Rig
from labd.errors import DaemonError
from labd.measure.campaign import summary
from labd.vocabulary import SPANS, percentile
from tests.labs import ring_lab
from tests.rigs import Background, background_rig
from tui.app import LabApp
from tui.render import sparkline
from tui.screens.confirm import ConfirmScreen
from tui.sentences import sentence
from tui.tabs.reconfigurations import KEEP, latency_rows, record

LAB = """
[[instrument]]
id = "ocs1"
driver = "polatis-scpi"
emulate = true
size = "8x8"
[instrument.emulator]
switch_time_ms = 2
jitter_ms = 0
[[endpoint]]
id = "h0.nic0"
launch_dbm = 0
[[endpoint]]
id = "h1.nic0"
launch_dbm = 0
[[fiber]]
from = "h0.nic0"
to = "ocs1:1"
[[fiber]]
from = "ocs1:9"
to = "h1.nic0"
[[instrument]]
id = "mesh1"
driver = "qontrol-mesh"
emulate = true
size = "4x4"
"""


@contextlib.asynccontextmanager
async def attached(tmp_path: Path, tag: str, body: str = LAB,
                   before: Callable[[Rig], Coroutine[Any, Any, Any]] | None = None
                   ) -> AsyncIterator[tuple[Background, LabApp, Pilot[None]]]:
    """A daemon on an emulated lab (``before`` run on it first), on a loop of its own as
    it would be in a process of its own, and the UI attached to it, synced from its first
    snapshot."""
    with background_rig(tmp_path, tag, body) as rig:
        if before is not None:
            await rig.call(before)
        app = LabApp(rig.daemon.url, "t")
        async with app.run_test(size=(120, 40)) as pilot:
            async with asyncio.timeout(15):
                await app.synced.wait()
            yield rig, app, pilot


async def until(app: LabApp, check: Callable[[], bool], timeout: float = 15) -> None:
    """Wait until ``check()`` holds, looking again after each event the app applies."""
    async with asyncio.timeout(timeout), app.applied:
        while not check():
            await app.applied.wait()


async def asked(app: LabApp) -> str:
    """Once the UI asks (a change's plan comes from the daemon first): the question and
    what the change would do, as the dialog shows them."""
    await until(app, lambda: isinstance(app.screen, ConfirmScreen))
    shown = [str(label.render()) for label in app.screen.query(Label)
             if label.id in ("question", "detail")]
    return "\n".join(shown)


def cell(table: DataTable, row: str, column: int) -> str:  # type: ignore[type-arg]
    return str(table.get_row(row)[column])


async def test_port_map_follows_the_daemon_and_makes_circuits(tmp_path: Path) -> None:
    async with attached(tmp_path, "tui") as (rig, app, pilot):
        table = app.query_one("#portmap", DataTable)
        # Every port of the 8x8 switch; the mesh, which no meter reads, in one row.
        assert table.row_count == 16 + 1
        assert cell(table, "mesh1:*", 3) == "8 ports"
        assert cell(table, "ocs1:1", 2) == ""  # no partner yet
        assert "live" in app.sub_title

        # A circuit typed at the keyboard is asked about first; no changes nothing.
        await pilot.press("c", *"h0.nic0", "enter", *"h1.nic0", "enter")
        assert "Make the circuit h0.nic0 → h1.nic0" in await asked(app)
        await pilot.press("n")
        assert app.screen is app.screen_stack[0] and not rig.daemon.engine.intended["ocs1"]
        # Yes makes it, and it appears on the port map.
        await pilot.press("c", *"h0.nic0", "enter", *"h1.nic0", "enter")
        await asked(app)
        await pilot.press("y")
        await until(app, lambda: cell(table, "ocs1:1", 2) == "9")
        assert cell(table, "ocs1:9", 2) == "1"
        # Both ports name the circuit end to end.
        await until(app, lambda: cell(table, "ocs1:9", 5) == "h0.nic0 → h1.nic0")
        assert cell(table, "ocs1:1", 5) == "h0.nic0 → h1.nic0"
        # Out of sight, the Reconfigurations tab is drawn when shown.
        reconf = app.query_one("#reconf", DataTable)
        assert reconf.row_count == 0 and app.reconfigurations.out_of_date
        await pilot.press("4")
        assert reconf.row_count == 1
        latency = app.query_one("#latency", DataTable)
        assert latency.get_row("ocs1:device")[2] == "1"  # one reconfiguration so far
        assert float(str(latency.get_row("ocs1:device")[3])) >= 2  # the 2 ms model
        await pilot.press("1")

        # Enter on the mesh's row shows its ports.
        table.move_cursor(row=table.get_row_index("mesh1:*"))
        await pilot.press("enter")
        assert table.row_count == 16 + 8 and cell(table, "mesh1:1", 2) == ""
        # A raw pair on the mesh: its routed path is drawn element by element.
        paths = app.query_one("#paths", DataTable)
        assert paths.display and paths.row_count == 0
        await pilot.press("p", *"mesh1", "enter", "1", "enter", "6", "enter", "y")
        await until(app, lambda: paths.row_count == 1)
        row = paths.get_row("mesh1:1")
        assert row[1] == "1→6"
        drawn = str(row[3])
        elements = rig.daemon.engine.switch("mesh1").paths()[1]  # type: ignore[index]
        assert len(elements) == 3  # a 4x4 Beneš network has three columns
        for element, state in elements:
            assert f"{element} {'═' if state == 'bar' else '╳'}" in drawn
        assert drawn.startswith("1 ") and drawn.endswith(" 6")

        # x breaks the raw pair under the cursor, after asking.
        table.move_cursor(row=table.get_row_index("mesh1:1"))
        await pilot.press("x")
        assert "Disconnect mesh1 port 1 from port 6" in str(
            app.screen.query_one("#question", Label).render())
        await pilot.press("y")
        await until(app, lambda: paths.row_count == 0)
        assert cell(table, "mesh1:1", 2) == ""

        # Help for the tab in view, and back.
        await pilot.press("question_mark")
        assert "Every port of every switch" in str(
            app.screen.query_one("#help-tab", Label).render())
        await pilot.press("escape")
        assert app.screen is app.screen_stack[0]

        # The filter narrows the map: by endpoint, then by port.
        await pilot.press("slash", *"h1.nic0")
        assert table.row_count == 2
        app.query_one("#port-filter", Input).value = ""
        await pilot.press(*"ocs1:9")
        assert app.query_one("#port-filter", Input).value == "ocs1:9"
        assert table.row_count == 1

        # A refused request is a notification, and changes nothing.
        await app.changes.change("circuit made", "POST", "/v1/circuits",
                          {"from": "h0.nic0", "to": "nowhere"}, str)
        notice = app.changes.last_notice
        assert "refused" in notice and "nowhere" in notice
        assert table.row_count == 1 and cell(table, "ocs1:9", 2) == "1"

        # x on the circuit's port breaks it end to end.
        await pilot.press("enter")  # back to the map (one row: ocs1:9)
        await pilot.press("x")
        assert "Break the circuit h0.nic0 → h1.nic0" in str(
            app.screen.query_one("#question", Label).render())
        await pilot.press("y")
        await until(app, lambda: cell(table, "ocs1:9", 2) == "")
        assert not rig.daemon.engine.intended["ocs1"]


async def test_a_latency_measurement_from_the_ui(tmp_path: Path) -> None:
    async def circuit_kept(rig: Rig) -> None:  # a circuit the measurement must leave alone
        await rig.daemon.engine.reconfigure("ocs1", connect=[(2, 10)])

    async with attached(tmp_path, "tui4", before=circuit_kept) as (rig, app, pilot):
        # m on ocs1's row: the switch is filled in; 6 toggles of one free pair.
        portmap = app.query_one("#portmap", DataTable)
        portmap.move_cursor(row=portmap.get_row_index("ocs1:3"))
        await pilot.press("m", "enter", "enter", "backspace", "backspace", "6", "enter",
                          "enter")
        await until(app, lambda: "6 reconfigurations" in app.changes.last_notice, timeout=30)
        notice = app.changes.last_notice
        assert "ocs1 toggle" in notice and "device p50" in notice
        reconf = app.query_one("#reconf", DataTable)

        def causes() -> list[str]:
            return [str(reconf.get_row_at(i)[2]) for i in range(reconf.row_count)]

        # Every one is in the table as the daemon recorded it, with its cause.
        await until(app, lambda: causes().count("measurement") == 6)
        # The free ports are free again; the circuit that was there is untouched.
        assert rig.daemon.engine.intended["ocs1"] == {2: 10}
        assert app.query_one(TabbedContent).active == "reconfigurations"
        # A bad parameter is refused before anything is sent.
        await pilot.press("m", "enter", *"zigzag", "enter", "enter", "enter")
        assert "pattern 'zigzag'" in app.changes.last_notice
        # Nothing more was sent; the newest first, the circuit made before them last.
        assert causes() == ["measurement"] * 6 + ["api"]
        ids = [int(str(reconf.get_row_at(i)[0])) for i in range(reconf.row_count)]
        assert ids == sorted(ids, reverse=True)
        # The result is kept in its panel, not only in a passing notification.
        panel = app.query_one("#measure-result", Static)
        kept = str(panel.render())
        assert panel.display and "ocs1 toggle: 6 reconfigurations (6 ok)" in kept
        assert "device" in kept and "p99" in kept


async def test_a_failover_drill_from_the_ui(tmp_path: Path) -> None:
    async with attached(tmp_path, "tui5", ring_lab()) as (rig, app, pilot):
        await pilot.press("d", "y")  # the job is not running yet: the drill starts it
        await until(app, lambda: "drill done" in app.changes.last_notice, timeout=90)
        assert app.query_one(TabbedContent).active == "failover"
        latest = app.failover.latest
        assert latest is not None and latest["outcome"] == "recovered"
        # The recovery is numbered as the daemon recorded it (its events carry the id only
        # once it is recorded, at its end).
        title = str(app.query_one("#failover-title", Label).render())
        assert latest["id"] is not None and title.startswith(f"failover #{latest['id']} ")
        # The Events tab told each stage as a sentence, never "#None".
        told = [line.plain for _, kind, line in app.events.lines if kind == "failover"]
        assert told and not any("None" in line for line in told)
        assert any("recovered" in line and f"(failover #{latest['id']})" in line
                   for line in told)
        assert any("recovering" in line for line in told)
        timeline = app.query_one("#timeline", DataTable)
        assert timeline.row_count == 10
        assert float(str(timeline.get_row("first_step")[1])) > float(
            str(timeline.get_row("switches_acked")[1]))
        # The failed member was repaired and is a spare again.
        failed = latest["member"]
        assert failed in rig.daemon.jobs.job("ring4").spares
        await pilot.press("2")
        hosts = app.query_one("#hosttable", DataTable)
        host = failed.split(".")[0]
        await until(app, lambda: "spare for ring4" in str(hosts.get_row(host)[4]))


async def test_the_ui_marks_a_lost_daemon_stale_and_keeps_the_picture(tmp_path: Path) -> None:
    async with attached(tmp_path, "tui2") as (rig, app, pilot):
        rows = app.query_one("#portmap", DataTable).row_count
        await rig.call(lambda r: r.daemon.stop())  # the daemon goes away
        async with asyncio.timeout(15):
            await app.stale.wait()
        assert app.sub_title.startswith("STALE since")
        assert app.screen.has_class("stale")
        assert app.query_one("#portmap", DataTable).row_count == rows  # last picture kept

        # A switch that cannot be read keeps its last picture, and the event log says why.
        with pytest.raises(DaemonError):
            await app.ports.load(["ocs1"])
        assert app.query_one("#portmap", DataTable).row_count == rows
        async with asyncio.timeout(10):  # the tab posts the line to the app
            while not any(kind == "error" for _, kind, _ in app.events.lines):
                await pilot.pause()


async def test_every_tab_is_a_key_away(tmp_path: Path) -> None:
    async with attached(tmp_path, "tui3") as (_, app, pilot):
        tabs = app.query_one(TabbedContent)
        for key, tab in (("2", "hosts"), ("3", "failover"), ("4", "reconfigurations"),
                         ("5", "events"), ("1", "ports")):
            await pilot.press(key)
            assert tabs.active == tab
        # The command palette offers labd's actions and tabs.
        await pilot.press("ctrl+p", *"Show events")
        results = app.screen.query_one(OptionList)
        async with asyncio.timeout(10):  # the palette searches in a worker of its own
            while not any("Show events" in str(results.get_option_at_index(i).prompt)
                          for i in range(results.option_count)):
                await pilot.pause()
        await pilot.press("enter")
        await pilot.pause()
        assert tabs.active == "events"


async def test_events_that_arrive_while_the_ui_closes_touch_no_widget(tmp_path: Path) -> None:
    """While the app shuts down, its widgets go one by one and the tabs stay attached a
    little longer: an event delivered then is kept, not drawn (it once killed the event
    worker with NoMatches on the log that had already gone)."""
    async with attached(tmp_path, "tui6") as (_, app, pilot):
        await pilot.press("2")  # the hosts in view: a change there is drawn at once
        await app.events.query_one(RichLog).remove()
        await app.hosts.query_one(DataTable).remove()
        app._running = False  # what App._shutdown sets before it takes the screens down
        assert app.events.is_attached and app.hosts.is_attached
        await app._apply({"kind": "job.progress", "seq": 1, "data": {"job": "ring4"}})
        app.hosts.show([], [])
        assert app.events.lines[-1][1] == "job.progress"  # kept for when it could be shown


async def test_events_in_sentences_with_the_lab_in_the_title(tmp_path: Path) -> None:
    async with attached(tmp_path, "tui7") as (rig, app, pilot):
        # The lab by name, as the daemon gives it; the URL beside it.
        assert app.lab is not None and app.lab.startswith("tui7")
        assert app.title == f"labd · {app.lab}" and rig.daemon.url in app.sub_title
        await rig.call(lambda r: r.daemon.engine.connect_endpoints([("h0.nic0", "h1.nic0")]))
        await until(app, lambda: any(k == "reconfiguration" for _, k, _ in app.events.lines))
        line = next(line.plain for _, k, line in app.events.lines if k == "reconfiguration")
        # A wall-clock time, the kind, and a sentence: not a dict, not monotonic ns.
        assert re.fullmatch(r"\d\d:\d\d:\d\d\.\d{3} reconfiguration +ocs1: connected 1→9 in "
                            r"[\d.]+ ms \(api, reconfiguration #\d+\)", line), line
        # The filter keeps the lines with its words (or its kind).
        await pilot.press("5", "slash", *"ocs1: connected")
        log = app.query_one("#eventlog", RichLog)
        assert len(log.lines) == 1
        app.query_one("#event-filter", Input).value = "failover"
        await pilot.pause()
        assert len(log.lines) == 0

        # c offers the endpoints the UI knows of (here, the circuit's ends) as one types.
        await pilot.press("enter", "1", "c", "h", "1")
        field = app.screen.query_one("#src", Input)
        assert field.value == "h1"
        await pilot.press("right")  # takes the offer
        assert field.value == "h1.nic0"
        await pilot.press("escape")
        assert app.screen is app.screen_stack[0]


async def test_c_completes_the_labs_endpoints_and_shows_the_plan(tmp_path: Path) -> None:
    async with attached(tmp_path, "tui8") as (rig, app, pilot):
        # No circuit and no host yet: the offers are the lab's endpoints, from the API.
        assert app.lab_endpoints == ["h0.nic0", "h1.nic0"]
        await pilot.press("c", "h", "0")
        field = app.screen.query_one("#src", Input)
        assert field.value == "h0" and field._suggestion == "h0.nic0"
        await pilot.press("right")  # takes the offer
        assert field.value == "h0.nic0"
        await pilot.press("enter", "h", "1", "right")
        assert app.screen.query_one("#dst", Input).value == "h1.nic0"
        await pilot.press("enter")
        # Before the question: the switch and ports the daemon would cross-connect.
        shown = await asked(app)
        assert "Make the circuit h0.nic0 → h1.nic0" in shown
        assert "ocs1  port 1 → port 9" in shown and "Displaces no circuit" in shown
        assert not rig.daemon.engine.intended["ocs1"]  # asking changed nothing
        await pilot.press("y")
        table = app.query_one("#portmap", DataTable)
        await until(app, lambda: cell(table, "ocs1:1", 2) == "9")
        assert rig.daemon.engine.intended["ocs1"] == {1: 9}  # what the plan said

        # Again: it cannot be made, and the UI says what is in the way instead of asking.
        await pilot.press("c", *"h0.nic0", "enter", *"h1.nic0", "enter")
        await until(app, lambda: "cannot be made" in app.changes.last_notice)
        notice = app.changes.last_notice
        assert "the circuit is already up" in notice
        assert "ocs1:1 (circuit h0.nic0 → h1.nic0)" in notice
        assert app.screen is app.screen_stack[0]
        # An endpoint the lab does not have: the daemon's reason, nothing asked.
        await pilot.press("c", *"h0.nic0", "enter", *"nowhere", "enter")
        await until(app, lambda: "not planned" in app.changes.last_notice)
        assert "to: no endpoint 'nowhere'" in app.changes.last_notice
        assert app.screen is app.screen_stack[0]
        assert rig.daemon.engine.intended["ocs1"] == {1: 9}


def test_sentences() -> None:
    ms = 1_000_000
    assert sentence("reconfiguration", {
        "id": 4, "switch": "ocs1", "cause": "api", "outcome": "light-missing",
        "error": "no light on channel 1", "connected": [[1, 9]], "disconnected": [[2, 10]],
        "phases": {"requested": 0, "done": 30 * ms}}) == (
        "ocs1: connected 1→9 and disconnected 2→10 in 30.0 ms (api, reconfiguration #4): "
        "light-missing, no light on channel 1")
    # A recovery under way has no id yet: none is shown, the stage it reached is.
    running = sentence("failover", {
        "id": None, "job": "ring4", "trigger": "gpu-failed", "member": "h1.nic0",
        "outcome": "in-progress", "plan": {"spare": "s0.nic0"},
        "since_failure_ms": {"failure": 0.0, "reported": 0.7, "spare_chosen": 4.3,
                             "switches_acked": None}})
    assert running == ("job ring4: gpu-failed on h1.nic0, spare s0.nic0: recovering "
                       "(spare chosen at 4.3 ms)")
    assert sentence("gpu.health", {"host": "h1", "gpu": 0, "health": "failed",
                                   "was": "healthy", "reasons": ["Xid 79"]}) == \
        "host h1 GPU 0 is failed (was healthy): Xid 79"
    assert sentence("instrument.state", {"instrument": "ocs1", "kind": "state",
                                         "state": "offline", "detail": "timeout"}) == \
        "ocs1: state offline (timeout)"
    # A kind it does not know, or a shape it does not expect: the fields, as given.
    assert sentence("new.kind", {"a": 1, "b": "x"}) == "a: 1; b: x"
    assert sentence("reconfiguration", {"connected": 5}) == "connected: 5"


def test_sparkline() -> None:
    assert sparkline([]) == ""
    assert sparkline([1.0, 1.0]) == "▁▁"
    assert sparkline([0.0, 5.0, 10.0]) == "▁▅█"


def test_the_latency_table_agrees_with_the_campaign_summary() -> None:
    """The Reconfigurations tab's p50 and p99 are the ones ``labd measure`` reports for the
    same reconfigurations (labd.measure.campaign.summary), phase by phase."""
    ms = 1_000_000
    rows = []
    for i in range(40):
        start = 10**12 + i * 100 * ms
        acked = start + ms // 5 + (3 + i % 7) * ms + (i % 3) * ms // 8
        rows.append({"switch": "ocs2" if i % 4 == 0 else "ocs1", "k": 1, "outcome": "ok",
                     "phases": {"requested": start, "dispatched": start + ms // 5,
                                "activated": start + ms // 4, "acknowledged": acked,
                                "light": None if i % 5 == 0 else acked + (i % 11) * ms,
                                "done": acked + ms // 2}})
    phase_ms: dict[tuple[str, str], list[float]] = {}
    for row in rows:
        record(phase_ms, row)
    shown = {(r[0], r[1]): r for r in latency_rows(phase_ms)}
    reported = summary(rows)
    assert len(reported) == len(shown) == 2 * len(SPANS)
    for r in reported:
        _, _, n, p50, p99, most, spark = shown[(r["switch"], r["span"])]
        assert (int(n), p50, p99, most) == (r["n"], f"{r['p50']:.2f}", f"{r['p99']:.2f}",
                                           f"{r['max']:.2f}")
        assert len(spark) == r["n"]
    # Each switch's rows in the order of the phases.
    assert [r[1] for r in latency_rows(phase_ms)] == [name for name, _, _ in SPANS] * 2


def test_the_latency_table_keeps_the_latest_times() -> None:
    phase_ms: dict[tuple[str, str], list[float]] = {}
    for i in range(KEEP + 100):
        record(phase_ms, {"switch": "ocs1", "phases": {"dispatched": 0,
                                                       "acknowledged": i * 1000}})
    [(switch, phase, n, p50, p99, most, spark)] = latency_rows(phase_ms)
    kept = [i / 1000 for i in range(100, KEEP + 100)]
    assert (switch, phase, n) == ("ocs1", "device", str(KEEP))
    assert (p50, p99, most) == (f"{percentile(kept, 50):.2f}", f"{percentile(kept, 99):.2f}",
                                f"{kept[-1]:.2f}")
    assert spark == sparkline(kept[-60:]) and len(spark) == 60


async def test_the_title_wears_a_badge_while_the_daemon_is_unsure_of_its_hosts(
        tmp_path: Path) -> None:
    async def unsure(rig: Rig) -> None:
        rig.daemon.hosts.link_down("a test's outage", agents_connected=True)

    async def sure(rig: Rig) -> None:
        rig.daemon.hosts.link_up()

    # Unsure before the UI attaches: the badge comes from GET /v1/health at its resync.
    async with attached(tmp_path, "tui9", ring_lab(), before=unsure) as (rig, app, _):
        await until(app, lambda: "HOSTS UNSURE since" in app.sub_title)
        assert "a test's outage" in app.sub_title
        await rig.call(sure)
        await until(app, lambda: app.sub_title.endswith("— live"), timeout=30)
        # And from the hosts.unsure event while it follows the daemon.
        await rig.call(unsure)
        await until(app, lambda: "HOSTS UNSURE since" in app.sub_title)
        await rig.call(sure)
        await until(app, lambda: "UNSURE" not in app.sub_title, timeout=30)
