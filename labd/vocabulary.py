"""The words labd's parts share, defined once: the phases a reconfiguration passes through,
the spans measured between them, the stages of a failover, the one percentile every report
uses, and the kinds of the daemon's events. The API, the TUI, ``labd measure`` and the
benchmarks all import them from here, so the same data gives the same figures wherever it
is read.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any


class EventKind(enum.StrEnum):
    """The kinds of the daemon's events (docs/daemon.md, "Events"): each is its string on
    the wire, in the API's stream and on MQTT. An instrument's own events are
    ``instrument.<kind>``, beside these."""

    RECONFIGURATION = "reconfiguration"
    DRIFT = "drift"
    FAILOVER = "failover"
    DRILL = "drill"
    JOB_STATE = "job.state"
    JOB_PROGRESS = "job.progress"
    JOB_ERROR = "job.error"
    HOST_STATUS = "host.status"
    HOST_LOST = "host.lost"
    HOSTS_UNSURE = "hosts.unsure"
    GPU_HEALTH = "gpu.health"
    NIC_LINK = "nic.link"
    HA_LEADING = "ha.leading"
    STATUS = "status"
    WARNING = "warning"
    ERROR = "error"

#: A reconfiguration's phases, in order, each a CLOCK_MONOTONIC time in ns (docs/daemon.md):
#: asked for, first command sent, first light-moving command sent, its reply, light seen on
#: every metered path, recorded.
PHASES = ("requested", "dispatched", "activated", "acknowledged", "light", "done")

#: The spans reported for a reconfiguration: (name, from phase, to phase).
#: ``software`` is labd's own time before the switch hears of the change.
SPANS = (("device", "dispatched", "acknowledged"), ("switching", "activated", "acknowledged"),
         ("light", "dispatched", "light"), ("software", "requested", "dispatched"),
         ("total", "requested", "done"))

#: A failover's stages, in order (docs/daemon.md, "Failover").
STAGES = ("failure", "reported", "detected", "spare_chosen", "switches_acked",
          "light_verified", "links_up", "job_restarted", "collectives_ready", "first_step")

#: A job's statuses in which a member's failure is recovered.
ACTIVE = ("running", "degraded", "recovering")


def span_ns(phases: Mapping[str, int | None], start: str, end: str) -> int | None:
    """The time from phase ``start`` to phase ``end``; None where either was not reached."""
    a, b = phases.get(start), phases.get(end)
    return None if a is None or b is None else b - a


def span_ms(row: Mapping[str, Any], start: str, end: str) -> float | None:
    """A reconfiguration's span in ms, from its ``phases`` as the API gives them."""
    ns = span_ns(row.get("phases") or {}, start, end)
    return None if ns is None else ns / 1e6


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), interpolated linearly between the two nearest ranks:
    ``numpy.percentile``'s default ("linear", Hyndman and Fan's definition 7). NaN for no
    values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
