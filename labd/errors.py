"""labd's errors, all of them, in one tree (the instrument layer has its own in
``instruments.errors``; the two meet only where the daemon maps a driver's error).

Every one is reported to the user as its message, never as a traceback, and the message says
what to do. The HTTP API gives each :class:`RequestError` a status in one place
(``labd.daemon.api.errors``); the errors themselves know nothing of HTTP.

::

    LabdError
    ├── LabFileError           the lab file cannot be used (file, entry and field named)
    ├── StoreError             the record cannot be opened or written
    │   └── StoreUnavailable   a change or read the store refused now; nothing recorded (503)
    ├── BusError               the MQTT broker or its settings cannot be used
    │   ├── PayloadError       a message too large, too deep or not JSON
    │   └── RefusedMessage     a message not signed by who it claims, or replayed
    │       └── AlreadyTaken   the very message taken before (a retained copy, or a replay)
    ├── AccessError            the API's access file, token file or TLS settings cannot be used
    ├── RequestError           a request that cannot be carried out as asked  (HTTP 422)
    │   ├── NotFound           it names something the lab does not have       (404)
    │   │   ├── UnknownSwitch
    │   │   ├── UnknownPort
    │   │   └── UnknownJob
    │   ├── Conflict           it clashes with what is going on               (409)
    │   │   ├── PortBusy
    │   │   ├── JobError       the job is not in a state that allows it
    │   │   └── DrillBusy
    │   └── Unavailable        the switch is offline; nothing was sent         (503)
    │       └── NotLeader      this daemon is a standby, or its lease ran out (503)
    │           └── StaleEpoch a write from a leader whose epoch has passed
    ├── LeaseError             the standby lease (--ha) cannot be used
    ├── client side
    │   ├── DaemonError        the daemon refused a request or cannot be reached
    │   └── BackdoorError      the emulators' control endpoint refused or cannot be reached
    ├── GPU-host agent
    │   ├── AgentError         the agent's settings cannot be used
    │   ├── LinkDown           the way to the daemon failed (the agent reconnects)
    │   ├── SmiError           nvidia-smi could not report
    │   └── NvmlUnavailable    NVML cannot be used on this host
    └── measurement and drills
        ├── CampaignError      a campaign that cannot be run as asked
        ├── ScheduleError      a schedule file or replay that cannot be used
        ├── ProfileError       a failure profile that cannot be used
        ├── RunError           a kept run that cannot be found, made or read
        └── DrillError         a drill that could not be run as asked
"""

from __future__ import annotations

import asyncio


class LabdError(Exception):
    """Base of errors labd reports to the user as a message, never as a traceback."""


class LabFileError(LabdError):
    """The lab file cannot be used. ``problems`` holds one line per mistake, each naming
    the file, the entry and the field."""

    def __init__(self, path: str, problems: list[str]) -> None:
        self.path = path
        self.problems = problems
        super().__init__("\n".join(problems))


class StoreError(LabdError):
    """The store cannot be opened or written; the message says which and why."""


class BusError(LabdError):
    """The MQTT broker or its settings cannot be used."""


class PayloadError(BusError):
    """A message from the bus is too large, nests too deeply, or is not the JSON expected;
    it changes nothing."""


class RefusedMessage(BusError):
    """A message from the bus is not signed by who it claims to come from, or is a replay;
    it changes nothing."""


class AlreadyTaken(RefusedMessage):
    """A sealed message that was taken already: a replay, or a broker's retained copy read
    again by a new subscription (which is no fault)."""


class AccessError(LabdError):
    """The API's access settings (access file, token file, certificate) cannot be used; the
    message names the file and what to fix."""


# -- requests (the API answers each with a status: labd.daemon.api.errors) -------------------
class RequestError(LabdError):
    """A request that cannot be carried out as asked; nothing was changed."""


class NotFound(RequestError):
    """The request names a switch, port or job the lab does not have."""


class Conflict(RequestError):
    """The request clashes with what is going on (a port in use, a job's state, a drill)."""


class UnknownSwitch(NotFound):
    pass


class UnknownPort(NotFound):
    pass


class UnknownJob(NotFound):
    pass


class PortBusy(Conflict):
    pass


class JobError(Conflict):
    """A job request that cannot be carried out in the job's present state."""


class DrillBusy(Conflict):
    """A drill is already running on the job."""


class Unavailable(RequestError):
    """The switch is offline (reconnecting): nothing was sent."""


class NotLeader(Unavailable):
    """This daemon does not lead the lab now (a standby, or a leader whose lease ran out):
    changes go to the leader, whose API URL ``leader_url`` names where known."""

    def __init__(self, message: str, leader_url: str | None = None) -> None:
        super().__init__(message)
        self.leader_url = leader_url


class StaleEpoch(NotLeader):
    """A write fenced with an epoch that is no longer the lease's: another daemon took the
    lead meanwhile, and nothing was written."""


class LeaseError(LabdError):
    """The standby lease (``--ha``) cannot be used: its settings, or its database."""


class StoreUnavailable(StoreError, Unavailable):
    """The store refused a write or a read while running (a read-only or full disk, a file
    damaged under the daemon): the request is refused, never acknowledged, and nothing of
    it is recorded. The API answers 503, as for an offline switch."""


# -- client side -----------------------------------------------------------------------------
class DaemonError(LabdError):
    """The daemon refused a request or cannot be reached; the message says which."""


class BackdoorError(LabdError):
    """The control endpoint refused a request or cannot be reached."""


# -- the GPU-host agent ----------------------------------------------------------------------
class AgentError(LabdError):
    """The agent's settings cannot be used."""


class LinkDown(LabdError):
    """The way to the daemon failed; the agent reconnects."""


class SmiError(LabdError):
    """nvidia-smi could not report; ``lost`` says whether it reported a lost GPU."""

    def __init__(self, message: str, *, code: int, lost: bool = False) -> None:
        self.code, self.lost = code, lost
        super().__init__(message)


class NvmlUnavailable(LabdError):
    """NVML cannot be used on this host."""


# -- measurement and drills ------------------------------------------------------------------
class CampaignError(LabdError):
    """A campaign that cannot be run as asked (the message says which parameter)."""


class ScheduleError(LabdError):
    """A schedule file or request that cannot be used (the message says where)."""


class ProfileError(LabdError):
    """A failure profile (a TOML of rates or a CSV of events) or a model input that
    cannot be used (the message says which and where)."""


class RunError(LabdError):
    """A run that cannot be found, made or read (the message says which and why)."""


class DrillError(LabdError):
    """A drill could not be run as asked."""


def unwrap(error: BaseException,
           expected: tuple[type[BaseException], ...] = ()) -> BaseException:
    """The exception that says why: a leaf of an exception group, however deeply nested (a
    TaskGroup inside a library's TaskGroup nests them; before Python 3.11.4 even a raise in
    an ``except*`` block did), and ``error`` itself when it is no group. A leaf that is not
    ``expected`` (a bug beside a lost connection) wins over one that is, so that it is not
    lost; a cancellation is a leaf only where nothing else is."""
    if not isinstance(error, BaseExceptionGroup):
        return error
    leaves = [unwrap(inner, expected) for inner in error.exceptions]
    ranked = sorted(leaves, key=lambda leaf: (isinstance(leaf, asyncio.CancelledError),
                                              isinstance(leaf, expected)))
    return ranked[0]
