"""The host wire's one schema: what the agent builds is what the daemon reads, and the JSON
an agent of before the schema sends (docs/agent.md's table) is still read the same."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from labd.agent.backends import EmulatedBackend
from labd.agent.reporter import Agent
from labd.errors import PayloadError
from labd.hostwire import (
    GpuHealth,
    Heartbeat,
    JobCommand,
    JobError,
    JobProgress,
    NicLink,
    RankSpec,
    read_event,
    read_heartbeat,
)


async def test_the_agents_heartbeat_is_read_back_as_built() -> None:
    agent = Agent(lab="x", host="h1", mqtt="mqtt://127.0.0.1:1", backend=EmulatedBackend(2))
    beat, verdicts = await agent.snapshot()
    beat.nics = {"h1.nic0": True}
    raw = agent.stamp(beat)
    read = read_heartbeat(raw)
    assert read.sent_ns is not None and read.at_ns == beat.at_ns
    assert [g["index"] for g in read.gpus] == sorted(verdicts) == [0, 1]
    assert read.gpus[0]["health"] == "healthy" and read.nics == {"h1.nic0": True}
    assert set(json.loads(raw)) == {"host", "sent_ns", "at_ns", "interval_s", "lost_gpu",
                                    "error", "gpus", "nics", "jobs"}
    assert read.jobs is None  # said in the heartbeats that may bring news alone


def test_a_heartbeat_carries_each_runs_progress_read_strictly() -> None:
    run = {"job": "ring4", "epoch": 3, "run": "ab12",
           "ranks": [{"rank": 1, "at": {"started": 10, "ready": 11}, "code": None},
                     {"rank": 2, "at": {"started": 10, "exited": 12}, "code": 1}]}
    beat = Heartbeat(gpus=[], jobs=[run])  # type: ignore[list-item]
    read = read_heartbeat(beat.stamped(1))
    assert type(read) is Heartbeat and read.jobs == [run]
    # An agent from before runs were carried: nothing said, nothing learnt.
    assert read_heartbeat(b'{"gpus": []}').jobs is None


@pytest.mark.parametrize(("jobs", "kept"), [
    ('"ring4"', None),
    ('[{"job": "j"}]', []),
    ('[5, {"job": "j", "epoch": 1, "run": "r", "ranks": [7, {"rank": 0, "at": '
     '{"started": 5, "ready": "x", "bogus": 1}, "code": 1.5}]}]',
     [{"job": "j", "epoch": 1, "run": "r",
       "ranks": [{"rank": 0, "at": {"started": 5}, "code": None}]}]),
])
def test_a_heartbeats_jobs_never_refuse_it(jobs: str, kept: object) -> None:
    """What the agent runs is a hint: a heartbeat refused for it would be a host not
    heard, so what the daemon cannot read of it is left out."""
    read = read_heartbeat(b'{"gpus": [], "jobs": ' + jobs.encode() + b"}")
    assert read.jobs == kept


@given(st.recursive(st.none() | st.booleans() | st.integers()
                    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["job", "epoch", "run", "ranks", "rank",
                                                       "at", "code", "started", "step"]),
                                      inner, max_size=5), max_leaves=30))
def test_any_jobs_field_is_read_or_left_out(jobs: object) -> None:
    read = read_heartbeat(json.dumps({"gpus": [], "jobs": jobs}).encode())
    assert read.jobs is None or all(isinstance(r["ranks"], list) for r in read.jobs)


def test_the_documented_json_of_earlier_agents_is_read() -> None:
    beat = json.dumps({"host": "h1", "at_ns": 5, "lost_gpu": False, "error": None,
                       "interval_s": 1.0, "sent_ns": 7, "nics": {},
                       "gpus": [{"index": 0, "health": "failed", "reasons": ["Xid 79"],
                                 "uuid": "GPU-1"}]}).encode()
    assert read_heartbeat(beat).gpus == [{"index": 0, "health": "failed",
                                          "reasons": ["Xid 79"], "uuid": "GPU-1"}]
    for body, kind in (
            ({"host": "h1", "gpu": 0, "health": "failed", "was": "healthy",
              "reasons": ["Xid 79"], "at_ns": 5, "since_ns": 4}, GpuHealth),
            ({"host": "h1", "nic": "h1.nic0", "up": False, "was": True, "at_ns": 5}, NicLink),
            ({"host": "h1", "job": "ring", "epoch": 2, "run": "9f2c61d0", "rank": 1,
              "progress": "step", "step": 3, "code": None, "at_ns": 5}, JobProgress),
            ({"host": "h1", "job": "ring", "epoch": 2, "rank": 1, "progress": "exited",
              "code": 0}, JobProgress),  # an agent from before runs had names
            ({"host": "h1", "job": None, "error": "bad job command"}, JobError)):
        message = read_event(json.dumps(body).encode())
        assert type(message) is kind
        assert {k: v for k, v in message.model_dump().items() if k in body} == body


def test_events_keep_to_their_own_fields_on_the_wire() -> None:
    # An older daemon tells events apart by their keys ("job", then "nic"): a GPU's or a
    # NIC's event must carry neither of the others' keys.
    gpu = json.loads(GpuHealth(gpu=0, health="failed").stamped(1))
    nic = json.loads(NicLink(nic="n", up=True).stamped(1))
    assert "job" not in gpu and "nic" not in gpu and "job" not in nic
    progress = json.loads(JobProgress(job="j", epoch=1, rank=0, progress="ready").stamped(1))
    assert "error" not in progress


def test_the_job_commands_as_sent() -> None:
    start = JobCommand(action="start", job="ring", epoch=3, run="ab",
                       ranks=[RankSpec(rank=0, host="h0", endpoint="h0.nic0", gpu=0)])
    assert start.wire() == {"action": "start", "job": "ring", "epoch": 3, "run": "ab",
                            "ranks": [{"rank": 0, "host": "h0", "endpoint": "h0.nic0",
                                       "gpu": 0}]}
    assert JobCommand(action="stop", job="ring").wire() == {"action": "stop", "job": "ring"}
    assert JobCommand.model_validate_json(json.dumps(start.wire())) == start


@pytest.mark.parametrize(("raw", "words"), [
    (b'{"gpus": [{"index": 0, "health": "poorly"}]}', "gpus.0.health"),
    (b'{"gpus": "all"}', "'gpus' must be a list"),
    (b'[]', "not a JSON object"),
    (b'{"gpus": [], "x": NaN}', "NaN is not a JSON value"),
    (b'\xff', "not UTF-8"),
])
def test_a_bad_heartbeat_says_what_is_wrong(raw: bytes, words: str) -> None:
    with pytest.raises(PayloadError, match=words):
        read_heartbeat(raw)


def test_a_bad_event_names_the_field() -> None:
    with pytest.raises(PayloadError, match=r"a NIC event needs .*\(up: "):
        read_event(b'{"nic": "n", "up": "yes"}')
    with pytest.raises(PayloadError, match=r"a job event needs .*\(rank: "):
        read_event(b'{"job": "j", "epoch": 1, "rank": true, "progress": "ready"}')


def test_a_heartbeat_without_gpus_is_refused_but_a_strange_interval_is_dropped() -> None:
    with pytest.raises(PayloadError, match="gpus: Field required"):
        read_heartbeat(b"{}")
    assert read_heartbeat(b'{"gpus": [], "interval_s": -1}').interval_s is None
    # Read strictly first, then loosely: what the watch cannot use is dropped, not refused.
    loose = read_heartbeat(b'{"gpus": [], "error": 5, "sent_ns": "x", "nics": {"n": 1}}')
    assert (loose.error, loose.sent_ns, loose.nics) == ("5", None, {"n": True})
    assert Heartbeat.model_validate({"gpus": [], "interval_s": 2}).interval_s == 2.0


def test_a_job_command_from_a_newer_daemon_is_taken_without_what_it_does_not_know() -> None:
    """A daemon upgraded before its agents may send fields they do not know (``run`` was
    one): an agent that refused them would refuse every job start until upgraded."""
    command = JobCommand.model_validate_json(json.dumps({
        "action": "start", "job": "ring4", "epoch": 3, "run": "ab12", "priority": 1,
        "ranks": [{"rank": 0, "host": "h0", "endpoint": "h0.nic0", "gpu": 0, "numa": 1}]}))
    assert (command.job, command.epoch, command.run) == ("ring4", 3, "ab12")
    assert command.ranks[0].endpoint == "h0.nic0"


@pytest.mark.parametrize("payload", [
    b'{"gpus": [{"index": 0, "health": "healthy", "reasons": null}]}',
    b'{"host": 5, "gpus": []}',
    b'{"gpus": [{"index": 0, "health": "healthy", "uuid": 7}]}',
    b'{"gpus": [{"index": 0, "health": "healthy", "reasons": "xid"}], "nics": []}',
])
def test_a_heartbeat_is_refused_for_its_gpus_index_or_health_alone(payload: bytes) -> None:
    """A heartbeat refused is a host not heard, and in time a host declared lost: what an
    agent (an older one, another's) writes beside a GPU's index and health is kept where
    it can be and dropped where it cannot, as the daemon always took it."""
    beat = read_heartbeat(payload)
    assert all(isinstance(g.get("reasons", []), list) for g in beat.gpus)
    with pytest.raises(PayloadError, match="'gpus' must be a list"):
        read_heartbeat(b'{"gpus": [{"index": 0, "health": "fine"}]}')


@pytest.mark.parametrize(("payload", "kind"), [
    (b'{"gpu": 0, "health": "failed", "reasons": null}', GpuHealth),
    (b'{"gpu": 0, "health": "failed", "was": "unknown"}', GpuHealth),
    (b'{"nic": "n0", "up": true, "was": "up"}', NicLink),
    (b'{"job": "j", "epoch": 1, "rank": 0, "progress": "step", "step": 1.0}', JobProgress),
    (b'{"job": "j", "epoch": "x", "error": "boom"}', JobError),
])
def test_an_event_is_refused_only_for_what_it_is_about(payload: bytes, kind: type) -> None:
    """A failure report refused is a failure found a heartbeat late: only the fields that
    say what happened (a GPU and its health, a job's rank and progress) can refuse one."""
    assert isinstance(read_event(payload), kind)
