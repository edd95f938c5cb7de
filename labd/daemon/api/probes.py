"""``/healthz`` and ``/readyz``: whether the daemon is alive and whether it is ready, for a
load balancer, a container's HEALTHCHECK or a monitoring probe, without a key.

- **Liveness** (``/healthz``): 200 ``{"status": "alive"}`` whenever the process answers.
  The route runs on the daemon's event loop, the one that runs everything else, so an
  answer says the loop turns; a loop that is stuck answers nothing and the probe times out.
- **Readiness** (``/readyz``): 200 ``{"status": "ready"}`` while the store is open and the
  daemon leads its lab, or stands by under ``--ha``; 503 ``{"status": "not ready"}`` while
  it takes over, before its store is open, and as it stops.

Neither says anything else (no lab, version, role or instrument: ``/v1/health``, with a key,
does), and neither fails for an instrument, the broker or a host that is down: the daemon
rides those out and a restart would not bring them back (docs/reliability.md). Both are
open to all, with or without ``--open-reads`` (labd.daemon.api.edge, ``OPEN_PATHS``).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from labd.daemon.api.deps import ServicesDep
from labd.daemon.services import Services

__all__ = ["LIVE_PATH", "READY_PATH", "ready", "router"]

LIVE_PATH = "/healthz"
READY_PATH = "/readyz"

router = APIRouter()


def ready(services: Services) -> bool:
    """Whether the daemon serves its lab now: store open, not stopping, and alone, leading
    or standing by (a takeover under way is neither)."""
    if services.stopping or services.store.writer_id is None:
        return False
    return services.role is None or services.role.name in ("leader", "standby")


# HEAD too: some probes (a load balancer's) ask with it. Not in the schema: these are for
# machines, the same on every daemon, and need no key.
@router.api_route(LIVE_PATH, methods=["GET", "HEAD"], include_in_schema=False)
async def healthz() -> JSONResponse:
    return JSONResponse({"status": "alive"}, headers={"cache-control": "no-store"})


@router.api_route(READY_PATH, methods=["GET", "HEAD"], include_in_schema=False)
async def readyz(services: ServicesDep) -> JSONResponse:
    if ready(services):
        return JSONResponse({"status": "ready"}, headers={"cache-control": "no-store"})
    return JSONResponse({"status": "not ready"}, status_code=503,
                        headers={"cache-control": "no-store"})
