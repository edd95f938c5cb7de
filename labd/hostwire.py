"""The messages between the daemon and its GPU hosts' agents, typed once for both sides.

The agent builds them and the daemon reads them with the same models, so the wire format
(docs/agent.md, the table of topics) lives here alone. Only pydantic and the bus's payload
limits are imported: the agent loads this module on every GPU host.

A heartbeat is read straight from its bytes by pydantic's own JSON parser, strictly (the
daemon reads 4,096 of them a second at a pod's size, docs/benchmarks.md); a payload that
parser refuses, or one that may hold ``NaN`` or ``Infinity`` (Python's reading of JSON, not
JSON), is read again by ``json.loads``, so that the refusal says what is wrong in the words
it always did.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, NotRequired

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, Strict, ValidationError
from typing_extensions import TypedDict

from labd.errors import PayloadError
from labd.mqtt.payload import MAX_BYTES, check

Health = Literal["healthy", "degraded", "failed"]
HEALTH: tuple[Health, ...] = ("healthy", "degraded", "failed")
Progress = Literal["started", "ready", "step", "exited"]
PROGRESS: tuple[Progress, ...] = ("started", "ready", "step", "exited")
#: The most GPUs a heartbeat may list (a lab file allows 64 per host).
MAX_GPUS = 256
#: The longest error text kept from a heartbeat.
MAX_ERROR = 1000
#: The most job runs, and ranks of one run, a heartbeat may list (a host runs a rank per
#: GPU at most).
MAX_RUNS = 64

Int = Annotated[int, Strict()]
"""An integer, not a bool nor a float that happens to be whole."""


def _interval(value: Any) -> float | None:
    # Bounded: the loss deadline is worked out from it (inf would stop the watch). An
    # interval the daemon cannot use is not kept, and the heartbeat still counts.
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= 3600:
        return float(value)
    return None


def _stamp(value: Any) -> int | None:
    return value if type(value) is int else None


def _error(value: Any) -> str | None:
    return None if value is None else str(value)[:MAX_ERROR]


def _nics(value: Any) -> dict[str, bool] | None:
    return {str(k): bool(v) for k, v in value.items()} if isinstance(value, dict) else None


Stamp = Annotated[int | None, BeforeValidator(_stamp)]
"""An agent's CLOCK_MONOTONIC ns; anything else is taken as not given."""


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _reasons(value: Any) -> list[str]:
    return [str(r) for r in value][:64] if isinstance(value, list) else []


def _health(value: Any) -> str | None:
    return value if value in HEALTH else None


def _flag(value: Any) -> bool | None:
    return value if isinstance(value, bool) else None


def _whole(value: Any) -> int | None:
    if type(value) is int:
        return value
    return int(value) if type(value) is float and value.is_integer() else None


def _gpus(value: Any) -> Any:
    # Only a GPU's index and health can refuse a heartbeat (a heartbeat refused is a host
    # not heard, and in time a host declared lost): its other fields, as some agent may
    # write them, are kept where they can be and dropped where they cannot.
    if not isinstance(value, list):
        return value
    kept = []
    for gpu in value:
        if isinstance(gpu, dict):
            gpu = dict(gpu)
            if "reasons" in gpu:
                gpu["reasons"] = _reasons(gpu["reasons"])
            if "uuid" in gpu and gpu["uuid"] is not None and not isinstance(gpu["uuid"], str):
                del gpu["uuid"]
        kept.append(gpu)
    return kept


def _runs(value: Any) -> list[Any] | None:
    # What the agent runs is a hint that fills in lost events: a heartbeat is never refused
    # for it (a heartbeat refused is a host not heard). A run or rank the daemon cannot
    # read is left out, and a list that is no list is taken as not given.
    if not isinstance(value, list):
        return None
    kept = []
    for run in value[:MAX_RUNS]:
        if not (isinstance(run, dict) and isinstance(run.get("job"), str)
                and type(run.get("epoch")) is int and isinstance(run.get("run"), str)
                and isinstance(run.get("ranks"), list)):
            continue
        ranks = []
        for rank in run["ranks"][:MAX_GPUS]:
            if not (isinstance(rank, dict) and type(rank.get("rank")) is int
                    and isinstance(rank.get("at"), dict)):
                continue
            at = {k: v for k, v in rank["at"].items() if k in PROGRESS and type(v) is int}
            code = rank.get("code")
            ranks.append({"rank": rank["rank"], "at": at,
                          "code": code if type(code) is int else None})
        kept.append({"job": run["job"], "epoch": run["epoch"], "run": run["run"],
                     "ranks": ranks})
    return kept


Text = Annotated[str | None, BeforeValidator(_text)]
"""A name, or nothing where the sender gave something else."""
Reasons = Annotated[list[str], BeforeValidator(_reasons)]
Whole = Annotated[int | None, BeforeValidator(_whole)]


class GpuVerdict(TypedDict):
    """One GPU in a heartbeat, kept as it is for ``GET /v1/hosts``."""

    index: Int
    health: Health
    reasons: NotRequired[list[str]]
    uuid: NotRequired[str | None]


class RankState(TypedDict):
    """One rank of a run in a heartbeat: when (agent clock) it first reached each stage it
    reached, and its exit code once it exited."""

    rank: Int
    at: dict[Progress, Int]
    code: NotRequired[Int | None]


class RunState(TypedDict):
    """A job's run on the host as a heartbeat carries it: what its ``started``, ``ready``,
    first ``step`` and ``exited`` events announced, so that the daemon learns after an
    outage what it missed."""

    job: str
    epoch: Int
    run: str
    ranks: Annotated[list[RankState], Field(max_length=MAX_GPUS)]


class Message(BaseModel):
    """What every agent message carries: the host, and when the agent sent it."""

    model_config = ConfigDict(extra="ignore")
    host: Text = None
    sent_ns: Stamp = None

    def stamped(self, sent_ns: int) -> bytes:
        """The message as sent, with when (lets the daemon place the agent's clock on
        its own)."""
        return self.model_copy(update={"sent_ns": sent_ns}).model_dump_json().encode()


class Heartbeat(Message):
    """``hosts/<host>/heartbeat``: the host's GPUs and their verdicts, every interval.

    Its fields are read strictly, as the agent writes them (no Python runs for them: a
    pod's heartbeats are the daemon's busiest path); a heartbeat whose other fields are not
    so is read again by :class:`LooseHeartbeat`, and only its ``gpus`` can refuse it."""

    sent_ns: Int | None = None
    at_ns: Int | None = None
    interval_s: Annotated[float, Field(gt=0, le=3600, allow_inf_nan=False)] | None = None
    lost_gpu: Annotated[bool, Strict()] = False
    """Whether the backend reports a GPU lost."""
    error: Annotated[str, Field(max_length=MAX_ERROR)] | None = None
    gpus: list[GpuVerdict] = Field(max_length=MAX_GPUS)
    nics: dict[str, Annotated[bool, Strict()]] | None = None
    """None: the agent watches no link (the daemon keeps what it knew)."""
    jobs: Annotated[list[RunState], Field(max_length=MAX_RUNS)] | None = None
    """Each job's latest run on the host, its ranks' progress so far; None: an agent from
    before it was carried (the daemon learns progress from events alone)."""


class LooseHeartbeat(Heartbeat):
    """A heartbeat as the daemon keeps it whatever its other fields say: what the watch
    cannot use is dropped, not refused (an interval out of bounds is not kept, and the
    heartbeat still counts)."""

    sent_ns: Stamp = None
    at_ns: Stamp = None
    interval_s: Annotated[float | None, BeforeValidator(_interval)] = None
    lost_gpu: Annotated[bool, BeforeValidator(bool)] = False
    error: Annotated[str | None, BeforeValidator(_error)] = None
    gpus: Annotated[list[GpuVerdict], Field(max_length=MAX_GPUS), BeforeValidator(_gpus)]
    nics: Annotated[dict[str, bool] | None, BeforeValidator(_nics)] = None
    jobs: Annotated[list[RunState] | None, BeforeValidator(_runs)] = None


class GpuHealth(Message):
    """``hosts/<host>/events``: a GPU's verdict changed (``failed`` is a failure report)."""

    gpu: Int
    health: Health
    # Only the GPU and its health can refuse a failure report: the rest, as some agent
    # may write it, is kept where it can be (a report refused is a failure found late).
    was: Annotated[Health | None, BeforeValidator(_health)] = None
    reasons: Reasons = Field(default_factory=list)
    at_ns: Stamp = None
    since_ns: Stamp = None
    """When the host says the condition began (an emulated host knows exactly)."""


class NicLink(Message):
    """``hosts/<host>/events``: a NIC's link went up or down."""

    nic: str
    up: Annotated[bool, Strict()]
    was: Annotated[bool | None, BeforeValidator(_flag)] = None
    at_ns: Stamp = None


class JobProgress(Message):
    """``hosts/<host>/events``: a rank of a job started, is ready, stepped or exited."""

    job: str
    epoch: Int
    run: str | None = None
    """The start's own name, echoed from the command (older agents send none)."""
    rank: Int
    progress: Progress
    step: Whole = None
    code: Whole = None
    at_ns: Stamp = None


class JobError(Message):
    """``hosts/<host>/events``: a job command the agent could not carry out."""

    job: Annotated[str | None, BeforeValidator(lambda v: None if v is None else str(v))] = None
    epoch: Whole = None
    run: Text = None
    rank: Whole = None
    error: Annotated[str, BeforeValidator(str)]
    at_ns: Stamp = None


Event = GpuHealth | NicLink | JobProgress | JobError
"""What an agent sends on its ``events`` topic."""


class RankSpec(BaseModel):
    # A field the agent does not know is left aside, not refused: a daemon upgraded before
    # its agents (it added ``run``) must not stop every job start on the way.
    model_config = ConfigDict(extra="ignore")
    rank: int = Field(ge=0)
    host: str
    endpoint: str
    gpu: int = Field(ge=0)


class JobCommand(BaseModel):
    """``hosts/<host>/job``, from the daemon: start a job's ranks (a new epoch, a new
    ``run``), or stop them. Fields it does not know are ignored (as in :class:`RankSpec`)."""

    model_config = ConfigDict(extra="ignore")
    action: Literal["start", "stop"]
    job: str
    epoch: int = Field(default=0, ge=0)
    run: str = Field(default="", max_length=64)
    ranks: list[RankSpec] = Field(default_factory=list)

    def wire(self) -> dict[str, Any]:
        """As sent: a stop names the job alone."""
        if self.action == "stop":
            return {"action": "stop", "job": self.job}
        return self.model_dump()


# -- reading what an agent sent --------------------------------------------------------------
def _constant(name: str) -> Any:
    # NaN and Infinity are Python's reading of JSON, not JSON: kept, they would make the
    # daemon's own answers (GET /v1/hosts) unreadable.
    raise ValueError(f"{name} is not a JSON value")


def loads(payload: bytes) -> Any:
    """An agent message's JSON, within the bus's limits; any mistake a PayloadError."""
    check(payload, what="it")
    try:
        return json.loads(payload.decode("utf-8"), parse_constant=_constant)
    except UnicodeDecodeError:
        raise PayloadError("it is not UTF-8 text") from None
    except (ValueError, RecursionError) as exc:
        raise PayloadError(f"it is not JSON: {exc}") from None


def _why(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" if where else str(first["msg"])


HEARTBEAT_SHAPE = (f"'gpus' must be a list of at most {MAX_GPUS} "
                   "{'index': n, 'health': ...}")


def read_heartbeat(payload: bytes) -> Heartbeat:
    """A heartbeat from its bytes; PayloadError says what is wrong with it."""
    if len(payload) > MAX_BYTES:
        check(payload, what="it")  # says how large it is
    # Its nesting is not scanned before pydantic's parser, which has a depth limit of its
    # own (past it, json_invalid, and json.loads' reading below scans first): the scan
    # would cost more than the parse for a heartbeat that lists a job's ranks (docs/agent.md).
    if b"NaN" not in payload and b"Infinity" not in payload:
        try:
            return Heartbeat.model_validate_json(payload)
        except ValidationError as exc:
            if exc.errors()[0]["type"] != "json_invalid":
                try:
                    return LooseHeartbeat.model_validate_json(payload)
                except ValidationError as loose:
                    raise PayloadError(_shape(loose)) from None
    data = loads(payload)  # says why it is not JSON, as json.loads does
    try:
        return LooseHeartbeat.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(_shape(exc)) from None


def _shape(exc: ValidationError) -> str:
    if exc.errors()[0]["type"] in ("model_type", "model_attributes_type"):
        return "not a JSON object"
    return f"{HEARTBEAT_SHAPE} ({_why(exc)})"


def read_event(payload: bytes) -> Event:
    """An event from its bytes, told apart by its fields as docs/agent.md lists them (a
    job's, a NIC's, else a GPU's); PayloadError says what is wrong with it."""
    data = loads(payload)
    if not isinstance(data, dict):
        raise PayloadError("not a JSON object")
    model: type[Event]
    if "job" in data:
        if data.get("error") is not None:
            model, shape = JobError, "a job error needs 'error'"
        else:
            model, shape = JobProgress, ("a job event needs 'job', 'epoch', 'rank' and "
                                         "'progress' (started, ready, step or exited), and "
                                         "'run' if any as a string")
    elif "nic" in data:
        model, shape = NicLink, "a NIC event needs 'nic' (a name) and 'up' (true/false)"
    else:
        model, shape = GpuHealth, "expected 'gpu' (an index) and 'health'"
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise PayloadError(f"{shape} ({_why(exc)})") from None
