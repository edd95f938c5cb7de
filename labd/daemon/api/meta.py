"""``/v1/health``: which lab the daemon runs (name and the lab file's SHA-256), its
version, the last event's sequence number, and whether it is sure of its hosts."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request

from labd import __version__
from labd.daemon.api.deps import ServicesDep, lab_sha256
from labd.events import Event
from labd.vocabulary import EventKind

if TYPE_CHECKING:
    from labd.daemon.services import Services

router = APIRouter()


class Unsure:
    """The hosts' unsure episode as a read (docs/daemon.md, "When a host is lost"): open or
    not, since when, how many hosts it holds, and why, from the watchdog's episode and the
    ``hosts.unsure`` event that opened it."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._why = ""
        services.hub.observe(self._observe)

    def _observe(self, event: Event) -> None:
        if event.kind == EventKind.HOSTS_UNSURE:
            self._why = str(event.data.get("detail") or "") if event.data.get("waiting") \
                else ""

    def describe(self) -> dict[str, Any]:
        """``{"unsure": false}``, or the open episode: ``since_ns`` (the daemon's
        CLOCK_MONOTONIC, as a host's ``last_beat_ns``), ``for_s``, ``hosts`` held, ``lost``
        meanwhile (by last will or a silence beyond doubt) and ``why``."""
        episode = self.services.hosts.unsure
        if episode is None:
            return {"unsure": False}
        since = int(episode["since_ns"])
        return {"unsure": True, "since_ns": since,
                "for_s": round(max(0, time.monotonic_ns() - since) / 1e9, 3),
                "hosts": episode["hosts"], "lost": episode["lost"],
                "why": self._why or "the daemon cannot yet tell whether its hosts are silent"}


@router.get("/v1/health")
async def health(services: ServicesDep, request: Request) -> dict[str, Any]:
    answer = {"lab": services.lab.lab.name, "version": __version__,
              "seq": services.hub.last_seq, "lab_sha256": lab_sha256(request),
              "hosts": request.app.state.unsure.describe()}
    if services.role is not None:  # --ha: leader, standby or taking over, and who leads
        answer["ha"] = services.role.describe()
    return answer
