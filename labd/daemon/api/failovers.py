"""``/v1/failovers``: the recorded recovery timelines, stage by stage."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query
from sqlalchemy.orm import Session

from labd.daemon.api.bodies import MAX_INT
from labd.daemon.api.deps import ServicesDep
from labd.daemon.api.shapes import failover_dict
from labd.store import queries

router = APIRouter()


@router.get("/v1/failovers")
async def failovers(services: ServicesDep, job: str | None = None,
                    limit: Annotated[int, Query(ge=1, le=10_000)] = 100
                    ) -> list[dict[str, Any]]:
    """Recovery timelines, newest first."""
    return await services.store.read(lambda session: [
        failover_dict(row) for row in queries.failovers(session, job=job, limit=limit)])


@router.get("/v1/failovers/{failover}")
async def failover(failover: Annotated[int, Path(ge=0, le=MAX_INT)],
                   services: ServicesDep) -> dict[str, Any]:
    def work(session: Session) -> dict[str, Any] | None:
        row = queries.failover(session, failover)
        return None if row is None else failover_dict(row)

    found = await services.store.read(work)
    if found is None:
        raise HTTPException(404, f"no failover {failover}")
    return found
