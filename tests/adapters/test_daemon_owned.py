"""The framework adapters on a running daemon (labd.adapters): a real RunEngine, ophyd-async
and QCoDeS against a daemon on an emulated lab, served from a thread of its own. Every
change a plan makes is the daemon's: it shows in ``GET /v1/reconfigurations`` with its
phases."""

from __future__ import annotations

import io
import json
import logging
import math
import time
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import event_model
import matplotlib
import pytest
from bluesky import RunEngine
from bluesky import plan_stubs as bps
from bluesky import plans as bp
from bluesky import preprocessors as bpp
from bluesky.callbacks import LiveTable
from bluesky.callbacks.best_effort import BestEffortCallback
from hypothesis import given
from hypothesis import strategies as st
from ophyd_async.core import init_devices

from labd.adapters.blocking import DaemonLab
from labd.adapters.daemon import DaemonTarget, pairs_of
from labd.adapters.ophyd import DaemonMeter, DaemonSwitch
from labd.errors import DaemonError, RequestError
from tests.labs import endpoint, fiber, meter, switch
from tests.rigs import Background, background_rig

#: Light into port 1 of an 8x8 switch; outputs 9 and 10 feed meter channels 1 and 2.
LAB = (switch(switch_ms=1, size="8x8"), meter(emulator={"options": {"noise_db": 0.0}}),
       endpoint("laser", launch_dbm=0), fiber("laser", "ocs1:1"),
       fiber("ocs1:9", "pm1:1"), fiber("ocs1:10", "pm1:2"))
LIT_ABOVE_DBM, DARK_BELOW_DBM = -10.0, -60.0


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Background]:
    with background_rig(tmp_path_factory.mktemp("owner"), "owner", *LAB,
                        light_window_s=0.05) as bg:
        yield bg


@pytest.fixture
def lab(rig: Background) -> Iterator[DaemonLab]:
    with DaemonLab(rig.daemon.url, token="t") as daemon:
        daemon.switch("ocs1").replace({})
        yield daemon


class Problems(logging.Handler):
    """Every record at WARNING or above, from any logger (a callback's suppressed
    traceback is logged by bluesky)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.mark.timeout(180)  # matplotlib draws BestEffortCallback's figures: seconds each
def test_a_scan_over_one_port_with_a_meter_as_detector(rig: Background, lab: DaemonLab
                                                        ) -> None:
    RE = RunEngine()
    documents: list[tuple[str, dict[str, Any]]] = []
    RE.subscribe(lambda name, doc: documents.append((name, doc)))
    matplotlib.use("Agg")  # the plots drawn as a notebook's would be, off screen
    bec = BestEffortCallback()
    bec.disable_plots()  # each figure costs seconds here: drawn for the map's scan alone
    RE.subscribe(bec)
    RE.subscribe(LiveTable(["ocs-ports-1-output", "pm-channels-1-power"]))
    problems = Problems()
    logging.getLogger().addHandler(problems)
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            with init_devices():
                ocs = DaemonSwitch("ocs1", ports=[1], url=rig.daemon.url, token="t")
                pm = DaemonMeter("pm1", channels=[1, 2], url=rig.daemon.url, token="t")
            RE(bps.mv(ocs.cross_connects, {1: 9}))
            RE(bp.scan([pm], ocs.ports[1].output, 9, 10, 2))
            bec.enable_plots()  # a scan over the whole map: what raised in the plots before
            RE(bp.list_scan([pm, ocs], ocs.cross_connects, [{1: 9}, [(1, 10)]]))
            bec.disable_plots()
            RE(bp.count([ocs, pm], 2))
    finally:
        logging.getLogger().removeHandler(problems)
    assert not problems.records, [r.getMessage() for r in problems.records]
    assert "Traceback" not in err.getvalue() + out.getvalue(), err.getvalue()
    assert "ocs-ports-1-output" in out.getvalue()  # the tables were printed

    for name, doc in documents:
        json.dumps(doc, allow_nan=True)
        event_model.schema_validators[event_model.DocumentNames(name)].validate(doc)
    events = [doc["data"] for name, doc in documents if name == "event"]
    scan, mapped, counted = events[:2], events[2:4], events[4:]
    assert [e["ocs-ports-1-output"] for e in scan] == [9, 10]
    # The light follows the port: on channel 1, then on channel 2.
    assert scan[0]["pm-channels-1-power"] > LIT_ABOVE_DBM > DARK_BELOW_DBM > \
        scan[0]["pm-channels-2-power"]
    assert scan[1]["pm-channels-2-power"] > LIT_ABOVE_DBM
    assert [e["ocs-cross_connects"] for e in mapped] == [[[1, 9]], [[1, 10]]]
    assert mapped[1]["ocs-ports-1-power"] == pytest.approx(mapped[1]["pm-channels-2-power"])
    assert all(e["ocs-ports-1-output"] == 10 for e in counted)

    # Each move was the daemon's: recorded, with its phases.
    records = lab.get("/v1/reconfigurations", switch="ocs1", limit=10)
    assert any(r["outcome"] == "ok" and r["phases"]["done"] for r in records)
    assert lab.switch("ocs1").cross_connects() == {1: 10}


def test_the_blocking_facade_moves_one_port_and_reads_its_power(lab: DaemonLab) -> None:
    ocs, pm = lab.switch("ocs1"), lab.meter("pm1")
    assert pm.info["logging"] is True and pm.info["channels"] == 4
    assert ocs.set_output(1, 9) is not None
    assert ocs.set_output(1, 9) is None  # there already: no request
    assert ocs.output(1) == 9 and ocs.output(9) == 1
    assert ocs.power(1) == pytest.approx(pm.read_power(1)) and ocs.power(1) > LIT_ABOVE_DBM
    ocs.set_output(1, 10)
    assert ocs.cross_connects() == {1: 10}
    series = pm.read([2], points=20, interval_s=1e-3)
    assert len(series[2]) == 20 and min(series[2]) > LIT_ABOVE_DBM
    ocs.set_output(1, 0)
    assert ocs.cross_connects() == {} and math.isnan(ocs.power(1))


def test_what_the_daemon_lacks_is_named(lab: DaemonLab) -> None:
    with pytest.raises(DaemonError, match="no switch 'ocsX'; its switches: ocs1"):
        lab.switch("ocsX")
    with pytest.raises(DaemonError, match="no meter 'pmX'"):
        lab.meter("pmX")
    with pytest.raises(RequestError, match="'a' is not a port number"):
        lab.switch("ocs1").set_output(1, "a")  # type: ignore[arg-type]
    with pytest.raises(DaemonError, match="422"):
        lab.switch("ocs1").set_output(1, 2)  # two ingress ports: the daemon refuses


def test_maps_in_every_shape_a_framework_gives_them() -> None:
    assert pairs_of({1: 17}) == pairs_of({"1": 17}) == pairs_of([(1, 17)]) == [[1, 17]]
    assert pairs_of(None) == pairs_of({}) == []
    for bad in ("1:17", [(1,)], [(1, True)], {1.5: 2}, [(1, "x")], [{"1": 0, "2": 0}],
                ["12"], 17, True):
        with pytest.raises(RequestError):
            pairs_of(bad)  # type: ignore[arg-type]


PORTS = st.integers(min_value=0, max_value=2**31)


@given(st.dictionaries(PORTS, PORTS, max_size=20))
def test_a_map_reads_the_same_in_every_shape(mapping: dict[int, int]) -> None:
    expected = [[a, b] for a, b in mapping.items()]
    assert pairs_of(mapping) == expected
    assert pairs_of({str(a): b for a, b in mapping.items()}) == expected
    assert pairs_of(list(mapping.items())) == expected
    assert pairs_of(json.loads(json.dumps(expected))) == expected


@given(st.recursive(st.none() | st.booleans() | st.floats() | st.text(max_size=4)
                    | st.integers(), lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=3), inner, max_size=3), max_leaves=8))
def test_anything_else_is_a_request_error_or_a_map(value: Any) -> None:
    try:
        pairs = pairs_of(value)
    except RequestError:
        return
    assert all(type(a) is int and type(b) is int for a, b in pairs)


def test_a_target_from_the_lab_file_the_daemon_runs(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LABD_HOST", "LABD_PORT", "LABD_TLS_CERT", "LABD_TOKEN_FILE", "LABD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    token = tmp_path / "token"
    token.write_text("k3y\n")
    lab = tmp_path / "lab.toml"
    lab.write_text(f'[lab]\nname = "x"\n[daemon]\nhost = "0.0.0.0"\nport = 9471\n'
                   f'token_file = "{token}"\n')
    assert DaemonTarget.from_lab(lab) == DaemonTarget("http://127.0.0.1:9471", "k3y", None)
    assert DaemonTarget.from_lab(lab, token="other").token == "other"


STATION = """\
instruments:
  ocs:
    type: labd.adapters.qcodes.DaemonSwitchInstrument
    init: {{switch: ocs1, url: "{url}", token: t, ports: [1, 2]}}
  pm:
    type: labd.adapters.qcodes.DaemonMeterInstrument
    init: {{meter: pm1, url: "{url}", token: t, channels: [1, 2]}}
"""


def test_a_qcodes_station_from_yaml_and_dond_over_a_port(rig: Background, lab: DaemonLab,
                                                          tmp_path: Path) -> None:
    from qcodes.dataset import (
        ArraySweep,
        dond,
        initialise_or_create_database_at,
        load_or_create_experiment,
    )
    from qcodes.station import Station

    yaml = tmp_path / "station.yaml"
    yaml.write_text(STATION.format(url=rig.daemon.url))
    station = Station(config_file=str(yaml))
    ocs = station.load_instrument("ocs")
    pm = station.load_instrument("pm")
    try:
        ocs.cross_connects({1: 9})
        assert ocs.cross_connects() == {1: 9} and ocs.port1.output() == 9
        assert isinstance(ocs.port1.output(), int) and isinstance(pm.ch1.power(), float)
        snapshot = station.snapshot(update=True)
        json.dumps(snapshot)
        # Each port once (as port<n>), not again under the ports tuple.
        ocs_snapshot = snapshot["instruments"]["ocs"]
        assert ocs_snapshot["submodules"]["ports"] == {
            "snapshotable": False, "__class__": "qcodes.instrument.channel.ChannelTuple"}
        assert ocs_snapshot["submodules"]["port1"]["parameters"]["output"]["value"] == 9
        assert ocs_snapshot["parameters"]["cross_connects"]["value"] == {1: 9}

        initialise_or_create_database_at(tmp_path / "q.db")
        load_or_create_experiment("owner", sample_name="emulated")
        with ocs.hold([1, 9, 10], holder="sweep 7"):
            dataset, _, _ = dond(ArraySweep(ocs.port1.output, [9, 10]), pm.ch1.power,
                                 pm.ch2.power, ocs.port1.power, show_progress=False)
            with pytest.raises(DaemonError, match="held by 'sweep 7'"):
                lab.switch("ocs1").set_output(1, 9)
        assert lab.get("/v1/holds") == []
        data = dataset.get_parameter_data()
        ch1 = list(data["pm_ch1_power"]["pm_ch1_power"])
        ch2 = list(data["pm_ch2_power"]["pm_ch2_power"])
        port = list(data["ocs_port1_power"]["ocs_port1_power"])
        assert ch1[0] > LIT_ABOVE_DBM > DARK_BELOW_DBM > ch1[1]
        assert ch2[1] > LIT_ABOVE_DBM and port == pytest.approx([ch1[0], ch2[1]])
        with pytest.raises(TypeError, match="not an int"):
            ocs.port1.output(9.5)  # Ints: refused before anything is sent
        assert lab.switch("ocs1").cross_connects() == {1: 10}
        series = pm.read_series([1, 2], points=10, interval_s=1e-3)
        assert [len(v) for v in series.values()] == [10, 10]
    finally:
        ocs.close()
        pm.close()


def test_a_plan_holds_its_ports_and_others_are_refused(rig: Background, lab: DaemonLab
                                                       ) -> None:
    RE = RunEngine()
    with init_devices():
        ocs = DaemonSwitch("ocs1", ports=[1], hold=[1, 9, 10], holder="scan 42",
                           url=rig.daemon.url, token="t")
    other = lab.switch("ocs1")
    refusals: list[str] = []

    def plan() -> Iterator[Any]:
        yield from bps.mv(ocs.ports[1].output, 9)  # the plan's own change names its hold
        try:
            other.set_output(1, 10)
        except DaemonError as refused:
            refusals.append(str(refused))
        refusals.append(repr([h["holder"] for h in lab.get("/v1/holds")]))

    RE(bpp.stage_wrapper(plan(), [ocs]))
    assert len(refusals) == 2 and "409 ocs1 port" in refusals[0], refusals
    assert "held by 'scan 42'" in refusals[0] and refusals[1] == "['scan 42']"
    assert lab.get("/v1/holds") == []
    other.set_output(1, 10)
    assert other.cross_connects() == {1: 10}


def test_a_script_holds_ports_for_a_block(rig: Background, lab: DaemonLab) -> None:
    with DaemonLab(rig.daemon.url, token="t") as someone_else:
        theirs = someone_else.switch("ocs1")
        with lab.hold("ocs1", [1, 9], holder="alice", ttl_s=1.0) as hold:
            lab.switch("ocs1").set_output(1, 9)
            with pytest.raises(DaemonError, match="held by 'alice'"):
                theirs.set_output(1, 10)
            # Renewed in the background: its time left goes up again, it is never lost.
            first = lab.get("/v1/holds")[0]["expires_in_s"]
            deadline = time.monotonic() + 10
            while lab.get("/v1/holds")[0]["expires_in_s"] <= first:
                assert time.monotonic() < deadline, "the hold was not renewed"
            assert hold.lost is None
        assert lab.get("/v1/holds") == []
        theirs.set_output(1, 10)


def test_a_scan_over_a_port_holds_it_for_the_plan(rig: Background, lab: DaemonLab) -> None:
    RE = RunEngine()
    with init_devices():
        ocs = DaemonSwitch("ocs1", ports=[1], hold=[1, 9, 10], url=rig.daemon.url, token="t")
        pm = DaemonMeter("pm1", channels=[1], url=rig.daemon.url, token="t")
    seen: list[list[str]] = []

    def during(name: str, doc: dict[str, Any]) -> None:
        if name == "event":  # the RunEngine stages the moved signal's Device: held now
            seen.append([h["holder"] for h in lab.get("/v1/holds")])

    RE(bp.scan([pm], ocs.ports[1].output, 9, 10, 2), during)
    assert seen == [["a Bluesky plan"]] * 2
    assert lab.get("/v1/holds") == []


def test_mock_devices_try_a_plan_without_a_daemon() -> None:
    RE = RunEngine()
    with init_devices(mock=True):
        ocs = DaemonSwitch("ocs1", ports=[1], url="http://127.0.0.1:9", token="t")
        pm = DaemonMeter("pm1", channels=[1], url="http://127.0.0.1:9", token="t")
    events: list[dict[str, Any]] = []
    RE(bp.scan([pm], ocs.ports[1].output, 9, 10, 2),
       lambda name, doc: events.append(doc) if name == "event" else None)
    assert [e["data"]["ocs-ports-1-output"] for e in events] == [9, 10]
