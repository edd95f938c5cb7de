"""``/v1/health``: which lab the daemon runs (name and the lab file's SHA-256), its
version, and the last event's sequence number."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from labd import __version__
from labd.daemon.api.deps import ServicesDep, lab_sha256

router = APIRouter()


@router.get("/v1/health")
async def health(services: ServicesDep, request: Request) -> dict[str, Any]:
    answer = {"lab": services.lab.lab.name, "version": __version__,
              "seq": services.hub.last_seq, "lab_sha256": lab_sha256(request)}
    if services.role is not None:  # --ha: leader, standby or taking over, and who leads
        answer["ha"] = services.role.describe()
    return answer
