"""``/v1/reconfigurations``: the record of every reconfiguration (filtered by switch,
cause, monotonic or wall-clock time), the power traces light verification logged for one,
and per-switch statistics of each span (``span_stats``, on the vocabulary's spans and
percentile, as every other report of labd)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from labd.daemon.api.bodies import MAX_INT
from labd.daemon.api.deps import ServicesDep
from labd.daemon.api.shapes import phases_dict, reconfiguration_dict, trace_dict
from labd.store import queries
from labd.vocabulary import SPANS, percentile, span_ns

router = APIRouter()

#: The most rows the statistics are taken over (the newest).
STATS_ROWS = 100_000


def span_stats(rows: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Per switch, from rows as ``GET /v1/reconfigurations`` lists them (``switch`` and
    ``phases`` in ns): the count, and each span's ``n``, ``p50_ms`` and ``p99_ms`` (None
    where no row reached both of the span's phases)."""
    phases: dict[str, list[Mapping[str, int | None]]] = {}
    for row in rows:
        phases.setdefault(row["switch"], []).append(row["phases"])
    out: dict[str, Any] = {}
    for switch in sorted(phases):
        mine = phases[switch]
        spans = {span: [d for p in mine if (d := span_ns(p, start, end)) is not None]
                 for span, start, end in SPANS}
        out[switch] = {"count": len(mine), **{
            span: {"n": len(values),
                   "p50_ms": percentile(values, 50) / 1e6 if values else None,
                   "p99_ms": percentile(values, 99) / 1e6 if values else None}
            for span, values in spans.items()}}
    return out


@router.get("/v1/reconfigurations")
async def reconfigurations(
    services: ServicesDep,
    switch: str | None = None, cause: str | None = None,
    since_ns: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
    until_ns: Annotated[int | None, Query(ge=0, le=MAX_INT)] = None,
    since: Annotated[datetime | None, Query(
        description="wall-clock time, ISO 8601 (UTC if no zone)")] = None,
    until: Annotated[datetime | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 1000,
) -> list[dict[str, Any]]:
    """Newest first; filter by switch, cause, monotonic (``*_ns``) or wall-clock time."""
    return await services.store.read(lambda session: [
        reconfiguration_dict(row) for row in queries.reconfigurations(
            session, switch=switch, cause=cause, since_ns=since_ns, until_ns=until_ns,
            since=since, until=until, limit=limit)])


@router.get("/v1/reconfigurations/{reconfiguration}/traces")
async def traces(reconfiguration: Annotated[int, Path(ge=0, le=MAX_INT)],
                 services: ServicesDep) -> list[dict[str, Any]]:
    """The power traces light verification logged for one reconfiguration (dBm)."""
    return await services.store.read(lambda session: [
        trace_dict(t) for t in queries.power_traces(session, reconfiguration)])


@router.get("/v1/reconfigurations/stats")
async def stats(services: ServicesDep, switch: str | None = None,
                cause: str | None = None) -> dict[str, Any]:
    """Per switch: count and p50/p99 (ms) of each phase's duration."""
    # Only the switch and the phases: a row's pair changes would cost a query each.
    rows = await services.store.read(lambda session: [
        {"switch": row.switch, "phases": phases_dict(row)}
        for row in queries.reconfigurations(session, switch=switch, cause=cause,
                                            limit=STATS_ROWS)])
    return span_stats(rows)
