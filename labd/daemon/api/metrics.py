"""``/metrics``: the daemon's figures in Prometheus' text format (labd/daemon/metrics.py).
Open to all by default, as scrapers expect; ``--metrics-need-key`` makes it a viewer's read
like the rest of the API."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException
from fastapi.responses import Response

from labd.daemon.api.deps import ServicesDep
from labd.daemon.api.edge import METRICS_PATH
from labd.daemon.metrics import CONTENT_TYPE

router = APIRouter()


@router.get(METRICS_PATH, include_in_schema=False)
async def metrics(services: ServicesDep) -> Response:
    if services.metrics is None:
        raise HTTPException(404, "this daemon keeps no metrics")
    # Off the loop: at thousands of hosts a scrape walks them all.
    body = await asyncio.to_thread(services.metrics.expose)
    return Response(body, media_type=CONTENT_TYPE)
