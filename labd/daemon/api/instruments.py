"""``/v1/instruments``: each instrument's driver, connection state and identity."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException

from labd.daemon.api.deps import ServicesDep

router = APIRouter()


@router.get("/v1/instruments")
async def instruments(services: ServicesDep) -> list[dict[str, Any]]:
    return services.instruments_state()


@router.get("/v1/instruments/{instrument}")
async def instrument(instrument: str, services: ServicesDep) -> dict[str, Any]:
    states = services.instruments_state()
    for entry in states:
        if entry["id"] == instrument:
            return entry
    raise HTTPException(404, f"no instrument {instrument!r}; instruments: "
                             f"{', '.join(e['id'] for e in states)}")
