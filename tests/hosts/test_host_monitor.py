"""The daemon's reading of agent messages, message by message: job progress, failure
reports, clock offsets, and bad messages that change nothing."""

import json
import time

from labd.events import EventHub
from labd.hosts.monitor import HostMonitor


def drain(sub) -> list[tuple[str, dict]]:  # type: ignore[no-untyped-def]
    out = []
    while not sub.queue.empty():
        event = sub.queue.get_nowait()
        out.append((event.kind, event.data))
    return out


def test_job_progress_failures_and_clock_offset() -> None:
    hub = EventHub()
    monitor = HostMonitor(hub, ["a"])
    _, sub = hub.subscribe()
    sent = time.monotonic_ns()
    monitor.handle("a", "events", json.dumps({
        "job": "ring4", "epoch": 2, "rank": 1, "progress": "ready", "at_ns": sent,
        "sent_ns": sent}).encode())
    state = monitor.hosts["a"]
    assert state.offset_ns is not None and state.offset_ns >= 0
    assert state.to_daemon_clock(100) == 100 + state.offset_ns
    monitor.handle("a", "events", json.dumps({
        "gpu": 3, "health": "failed", "reasons": ["Xid 79"], "at_ns": sent,
        "since_ns": sent - 5, "sent_ns": sent}).encode())
    assert state.gpu_health(3) == "failed"  # before any heartbeat said so
    monitor.handle("a", "events", json.dumps({"job": "ring4", "error": "no such job"}).encode())
    (progress, health, error) = drain(sub)
    assert progress == ("job.progress", {"host": "a", "job": "ring4", "epoch": 2, "run": None,
                                         "rank": 1, "progress": "ready", "step": None, "code": None,
                                         "at_ns": sent})
    assert health[0] == "gpu.health" and health[1]["since_ns"] == sent - 5
    assert error == ("job.error", {"host": "a", "job": "ring4", "epoch": None, "rank": None,
                                   "error": "no such job"})


def test_bad_job_events_are_warnings() -> None:
    hub = EventHub()
    monitor = HostMonitor(hub, ["a"])
    _, sub = hub.subscribe()
    for bad in ({"job": "ring4", "rank": "one", "epoch": 1, "progress": "ready"},
                {"job": "ring4", "rank": 0, "epoch": 1, "progress": "dancing"},
                {"job": 7, "rank": 0, "epoch": 1, "progress": "ready"}):
        monitor.handle("a", "events", json.dumps(bad).encode())
    events = drain(sub)
    assert [kind for kind, _ in events] == ["warning"] * 3
    assert "a job event needs 'job', 'epoch', 'rank' and 'progress'" in events[0][1]["detail"]
    # The daemon's own job commands come back on the wildcard subscription: ignored.
    monitor.handle("a", "job", b'{"action": "start"}')
    assert drain(sub) == []


def test_a_heartbeat_tells_the_progress_and_links_its_events_did_not() -> None:
    """An event the broker lost is told from the next heartbeat that carries it, once; one
    that arrived is not told again, and one that arrives after its heartbeat is not either
    (but a later step, which the heartbeat does not carry, is)."""
    hub = EventHub()
    monitor = HostMonitor(hub, ["a"])
    _, sub = hub.subscribe()

    def beat(ranks: list[dict], nics: dict[str, bool]) -> None:
        assert monitor.handle("a", "heartbeat", json.dumps({
            "gpus": [], "interval_s": 1.0, "sent_ns": time.monotonic_ns(), "nics": nics,
            "jobs": [{"job": "ring4", "epoch": 2, "run": "r2", "ranks": ranks}]}).encode()) \
            is None

    def event(**body: object) -> None:
        assert monitor.handle("a", "events", json.dumps(body).encode()) is None

    beat([{"rank": 0, "at": {}, "code": None}], {"a.nic0": False})
    drain(sub)
    event(job="ring4", epoch=2, run="r2", rank=0, progress="started", at_ns=5)
    # "ready" and the link's coming up were lost: the heartbeat tells them.
    beat([{"rank": 0, "at": {"started": 5, "ready": 6}, "code": None}], {"a.nic0": True})
    told = drain(sub)
    assert [(k, d.get("progress"), d.get("up"), d.get("source")) for k, d in told] == [
        ("job.progress", "started", None, None), ("nic.link", None, True, "heartbeat"),
        ("job.progress", "ready", None, "heartbeat")]
    assert told[2][1]["at_ns"] == 6 and told[2][1]["run"] == "r2"
    beat([{"rank": 0, "at": {"started": 5, "ready": 6}, "code": None}], {"a.nic0": True})
    event(job="ring4", epoch=2, run="r2", rank=0, progress="ready", at_ns=6)  # late
    event(nic="a.nic0", up=True, was=False, at_ns=6)  # late too
    assert drain(sub) == []
    beat([{"rank": 0, "at": {"started": 5, "ready": 6, "step": 7}, "code": None}],
         {"a.nic0": True})
    event(job="ring4", epoch=2, run="r2", rank=0, progress="step", step=9, at_ns=8)
    assert [(d["progress"], d["step"]) for _, d in drain(sub)] == [("step", None), ("step", 9)]
