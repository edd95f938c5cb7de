"""``/v1/holds``: ports of a switch held by one client (a plan, a script) for as long as it
renews the hold's lease; a change to them from anyone else is refused (409) with who holds
them.

A hold is taken with a time to live (``ttl_s``, a few seconds by default) and ends when the
client stops renewing it, so a plan that dies lets go on its own. Holds are kept in the
store (table ``port_holds``): a daemon that takes over the lead under ``--ha``, or that
restarts, reads them and refuses as the one before did. The switch routes check them: a
change that names its hold (``"hold": "<id>"`` in the body) may touch the hold's ports; any
other is refused if it would touch a held one.
"""

from __future__ import annotations

import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import Field
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from labd.daemon.api.bodies import Body, Port
from labd.daemon.api.deps import OPERATOR, ServicesDep
from labd.errors import Conflict, NotFound
from labd.fabric.engine import Engine
from labd.fabric.planning import replacing
from labd.store.models import PortHold
from labd.store.writer import Store

router = APIRouter()

#: A hold's time to live when the client names none (s): a client renews it every third.
DEFAULT_TTL_S = 5.0
MIN_TTL_S, MAX_TTL_S = 0.5, 600.0
#: A hold's id, as the API names it.
HoldId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9-]+$")]


@dataclass
class Hold:
    id: str
    switch: str
    ports: frozenset[int]
    holder: str
    ttl_s: float
    expires_at: float

    def as_dict(self, now: float) -> dict[str, Any]:
        return {"id": self.id, "switch": self.switch, "ports": sorted(self.ports),
                "holder": self.holder, "ttl_s": self.ttl_s,
                "expires_in_s": round(max(0.0, self.expires_at - now), 3)}


class HoldBody(Body):
    switch: str = Field(min_length=1, max_length=64)
    ports: list[Port] = Field(min_length=1, max_length=100_000)
    holder: str = Field(min_length=1, max_length=200,
                        description="who holds them, as a refusal names them")
    ttl_s: float = Field(DEFAULT_TTL_S, strict=True, ge=MIN_TTL_S, le=MAX_TTL_S,
                         allow_inf_nan=False,
                         description="the lease: renew (PUT) within it, or the hold ends")


class Holds:
    """The holds of one daemon: in memory for the switch routes' check, written through to
    the store; read again from it whenever the store's fence (the lead's epoch) is not the
    one they were read under."""

    _UNREAD = ("", -1)

    def __init__(self, store: Store) -> None:
        self.store = store
        self._holds: dict[str, Hold] = {}
        self._read_under: tuple[str, int] | None = self._UNREAD

    async def ready(self) -> None:
        if self._read_under == self.store.fence:
            return
        fence = self.store.fence
        rows = await self.store.read(lambda s: [
            Hold(r.id, r.switch, frozenset(r.ports), r.holder, r.ttl_s, r.expires_at)
            for r in s.scalars(select(PortHold))])
        self._holds = {h.id: h for h in rows}
        self._read_under = fence

    @property
    def held(self) -> bool:
        """Whether any hold is known (live or not yet found expired)."""
        return bool(self._holds)

    def live(self, now: float | None = None) -> list[Hold]:
        now = time.time() if now is None else now
        for gone in [i for i, h in self._holds.items() if h.expires_at <= now]:
            del self._holds[gone]
        return list(self._holds.values())

    def blocking(self, switch: str, ports: Iterable[int], hold: str | None) -> Hold | None:
        """The first live hold, not ``hold``, on any of ``ports`` of ``switch``."""
        if not self._holds:
            return None
        wanted = set(ports)
        return next((h for h in self.live() if h.switch == switch and h.id != hold
                     and h.ports & wanted), None)

    def refuse(self, switch: str, ports: Iterable[int], hold: str | None) -> None:
        if not self._holds:  # the hot path, where nobody holds anything
            return
        wanted = set(ports)
        found = self.blocking(switch, wanted, hold)
        if found is not None:
            mine = sorted(found.ports & wanted)
            raise Conflict(f"{switch} port{'s' if len(mine) > 1 else ''} "
                           f"{', '.join(map(str, mine))} held by {found.holder!r} (hold "
                           f"{found.id}, {max(0.0, found.expires_at - time.time()):.1f} s "
                           "left unless renewed)")

    async def take(self, body: HoldBody) -> Hold:
        await self.ready()
        self.refuse(body.switch, body.ports, None)
        hold = Hold(uuid.uuid4().hex[:16], body.switch, frozenset(body.ports), body.holder,
                    body.ttl_s, time.time() + body.ttl_s)
        await self._keep(hold)
        self._holds[hold.id] = hold
        return hold

    async def renew(self, hold_id: str) -> Hold:
        await self.ready()
        hold = next((h for h in self.live() if h.id == hold_id), None)
        if hold is None:
            raise NotFound(f"no hold {hold_id!r} (it ended: not renewed within its "
                           "ttl_s, or released)")
        hold.expires_at = time.time() + hold.ttl_s
        await self._keep(hold)
        return hold

    async def release(self, hold_id: str) -> None:
        await self.ready()
        self._holds.pop(hold_id, None)
        now = time.time()

        def work(session: Session) -> None:
            session.execute(delete(PortHold).where(
                (PortHold.id == hold_id) | (PortHold.expires_at <= now)))

        await self.store.run_write(work)

    async def _keep(self, hold: Hold) -> None:
        now = time.time()

        def work(session: Session) -> None:
            # Expired holds go with any write: nothing else sweeps them.
            session.execute(delete(PortHold).where(PortHold.expires_at <= now))
            session.merge(PortHold(id=hold.id, switch=hold.switch, ports=sorted(hold.ports),
                                   holder=hold.holder, ttl_s=hold.ttl_s,
                                   expires_at=hold.expires_at))

        await self.store.run_write(work)


_REGISTRIES: weakref.WeakKeyDictionary[Engine, Holds] = weakref.WeakKeyDictionary()


def holds_of(engine: Engine) -> Holds:
    """The holds on ``engine``'s switches (one registry per engine, made when first used)."""
    registry = _REGISTRIES.get(engine)
    if registry is None:
        registry = _REGISTRIES[engine] = Holds(engine.store)
    return registry


async def check(engine: Engine, switch: str, ports: Callable[[], Iterable[int]],
                hold: str | None) -> None:
    """Refuse (409) a change to held ``ports()`` of ``switch`` unless it names their hold;
    where nothing is held (the hot path's usual case) the ports are never worked out."""
    registry = holds_of(engine)
    await registry.ready()
    if registry.held:
        registry.refuse(switch, ports(), hold)


async def check_hops(engine: Engine, hops: Callable[[], Mapping[str, Iterable[Any]]],
                     hold: str | None) -> None:
    """As :func:`check`, for a circuit's hops: ``hops()`` gives each switch's pairs the
    circuit would make, or the ports it would free (their partners freed with them),
    worked out only where something is held."""
    registry = holds_of(engine)
    await registry.ready()
    if registry.held:
        for switch, items in hops().items():
            pairs = [i for i in items if isinstance(i, tuple | list)]
            ports = {p for pair in pairs for p in pair} | freed_ports(
                engine, switch, [i for i in items if not isinstance(i, tuple | list)])
            registry.refuse(switch, ports, hold)


def freed_ports(engine: Engine, switch: str, ports: Iterable[int]) -> set[int]:
    """The ports a disconnect of ``ports`` touches: each, and its partner in a circuit."""
    intended = engine.intended.get(switch, {})
    partner = {**intended, **{b: a for a, b in intended.items()}}
    return {q for p in ports for q in (p, partner.get(p)) if q is not None}


def replaced_ports(engine: Engine, switch: str, pairs: Iterable[tuple[int, int]]
                   ) -> set[int]:
    """The ports a whole-map change would touch: those of the pairs made and broken."""
    intended = engine.intended.get(switch, {})
    make, brk = replacing(intended, dict(pairs))
    return {p for a, b in (*make, *brk) for p in (a, b)}


@router.get("/v1/holds")
async def holds(services: ServicesDep) -> list[dict[str, Any]]:
    """Every live hold: switch, ports, holder, ``ttl_s``, ``expires_in_s``."""
    registry = holds_of(services.engine)
    await registry.ready()
    now = time.time()
    return [h.as_dict(now) for h in registry.live(now)]


@router.post("/v1/holds", status_code=201, **OPERATOR)
async def take(body: HoldBody, services: ServicesDep) -> dict[str, Any]:
    """Hold ``ports`` of ``switch`` for ``holder`` (409 naming who, if another holds any of
    them); renew within ``ttl_s`` or the hold ends."""
    services.engine.switch(body.switch)  # 404 for a switch the lab lacks
    hold = await holds_of(services.engine).take(body)
    return hold.as_dict(time.time())


@router.put("/v1/holds/{hold}", **OPERATOR)
async def renew(hold: HoldId, services: ServicesDep) -> dict[str, Any]:
    """Renew the lease: the hold lasts ``ttl_s`` from now (404 if it has ended)."""
    return (await holds_of(services.engine).renew(hold)).as_dict(time.time())


@router.delete("/v1/holds/{hold}", **OPERATOR)
async def release(hold: HoldId, services: ServicesDep) -> dict[str, Any]:
    """End the hold now (nothing to do if it has ended already)."""
    await holds_of(services.engine).release(hold)
    return {"released": hold}


__all__ = ["DEFAULT_TTL_S", "Hold", "Holds", "check", "check_hops", "freed_ports",
           "holds_of", "replaced_ports"]
