"""What agents say, whatever it is: the host monitor takes it, or refuses it with a warning
that names the host, and never raises, never keeps state for hosts the lab does not have,
and never keeps a value its watch could not use."""

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from labd.events import EventHub
from labd.hosts.monitor import MAX_GPUS, HostMonitor

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats()
                      | st.text(max_size=10),
                      lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=20)
FIELDS = ["gpus", "index", "health", "gpu", "interval_s", "sent_ns", "nics", "nic", "up",
          "job", "rank", "epoch", "progress", "error", "at_ns"]
MESSAGES = st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6)


def check_state(monitor: HostMonitor) -> None:
    assert set(monitor.hosts) == {"h1"}
    state = monitor.hosts["h1"]
    assert len(state.gpus) <= MAX_GPUS
    assert all(isinstance(g, dict) and type(g["index"]) is int for g in state.gpus)
    if state.interval_s is not None:
        assert math.isfinite(state.interval_s) and state.interval_s > 0
    assert state.error is None or isinstance(state.error, str)
    # What GET /v1/hosts answers, kept between changes, is strict JSON and the state now.
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} in the hosts' JSON")
    assert json.loads(monitor.as_json(), parse_constant=refuse) == [
        s.as_dict() for s in monitor.hosts.values()]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["h1", "h2", "", "#", "h1/x"]),
       st.sampled_from(["status", "heartbeat", "events", "job", "other"]),
       st.binary(max_size=500))
def test_any_bytes_from_any_host(host: str, kind: str, raw: bytes) -> None:
    monitor = HostMonitor(EventHub(), ["h1"])
    problem = monitor.handle(host, kind, raw)
    assert problem is None or isinstance(problem, str)
    check_state(monitor)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(["heartbeat", "events"]), st.lists(MESSAGES, min_size=1, max_size=4))
def test_any_json_from_the_lab_host(kind: str, messages: list[dict[str, object]]) -> None:
    monitor = HostMonitor(EventHub(), ["h1"])
    for message in messages:
        problem = monitor.handle("h1", kind, json.dumps(message).encode())
        assert problem is None or "host h1" in problem
        check_state(monitor)
    monitor.hosts["h1"].gpu_health(0)  # readable, whatever was said


def test_the_reproductions() -> None:
    monitor = HostMonitor(EventHub(), ["h1"])
    for host, kind, raw, words in (
            ("h1", "heartbeat", b'["' * 100_000, "nests"),
            ("h1", "heartbeat", b'{"gpus": [1, 2]}', "'gpus' must be a list"),
            ("h1", "heartbeat", b'{"gpus": [], "interval_s": 1e999}', None),
            ("h1", "events", b'{"gpu": true, "health": "failed"}', "expected 'gpu'"),
            # Python reads NaN as JSON; kept, GET /v1/hosts could not be read.
            ("h1", "heartbeat", b'{"gpus": [{"index": 0, "health": "healthy", "t": NaN}]}',
             "NaN is not a JSON value"),
            ("h1", "heartbeat", b'{"gpus": [], "error": -Infinity}', "Infinity"),
            ("nobody", "events", b'{"gpu": 0, "health": "failed"}', "no such host")):
        problem = monitor.handle(host, kind, raw)
        assert (problem is None) if words is None else (words in (problem or "")), problem
        check_state(monitor)
    assert monitor.hosts["h1"].interval_s is None  # an infinite interval is not kept


def test_pages_of_hosts_by_status() -> None:
    monitor = HostMonitor(EventHub(), [f"h{i}" for i in range(10)])
    for i in range(0, 10, 2):
        assert monitor.handle(f"h{i}", "status", b"online") is None
    online = [s.id for s in monitor.select("online")]
    assert online == ["h0", "h2", "h4", "h6", "h8"]
    first = [s.id for s in monitor.select("online", limit=2)]
    second = [s.id for s in monitor.select("online", after=first[-1], limit=2)]
    last = [s.id for s in monitor.select("online", after=second[-1], limit=2)]
    assert (first, second, last) == (["h0", "h2"], ["h4", "h6"], ["h8"])
    assert [s.id for s in monitor.select(after="h8")] == ["h9"]
    assert json.loads(monitor.as_json(monitor.select("lost"))) == []
    assert [h["id"] for h in json.loads(monitor.as_json(monitor.select("unknown", limit=3)))
            ] == ["h1", "h3", "h5"]
