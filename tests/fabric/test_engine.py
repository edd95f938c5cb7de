"""The engine's refusals: a request is checked before anything is touched, and each mistake
is an error of its own type (labd/errors.py), which the API answers with its status by type
(labd/daemon/api/errors.py), never by reading the message."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import func, select

from instruments.errors import InvalidRequest, NoSuchPort
from labd.daemon.api.errors import status_of
from labd.errors import (
    Conflict,
    DrillBusy,
    JobError,
    NotFound,
    PortBusy,
    RequestError,
    StoreUnavailable,
    Unavailable,
    UnknownJob,
    UnknownPort,
    UnknownSwitch,
)
from labd.store import Store
from labd.store.models import Reconfiguration
from tests.labs import switch
from tests.rigs import StartRig
from tests.store.refusals import refusing

TOKEN = "t"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_each_request_error_has_its_status_by_type() -> None:
    assert issubclass(NoSuchPort, InvalidRequest)
    cases = {UnknownSwitch: 404, UnknownPort: 404, UnknownJob: 404, NotFound: 404,
             PortBusy: 409, JobError: 409, DrillBusy: 409, Conflict: 409, Unavailable: 503,
             RequestError: 422}
    for kind, status in cases.items():
        # The message cannot sway it: only the type counts.
        assert status_of(kind("port 3 is not on this switch")) == status, kind


async def test_refusals_are_told_apart_by_type_and_change_nothing(start_rig: StartRig) -> None:
    async with start_rig("eng", switch(size="8x8", switch_ms=1), token=TOKEN) as rig:
        engine = rig.daemon.engine
        with pytest.raises(UnknownPort, match="99"):
            engine.plan("ocs1", connect=[(1, 99)])  # the driver's NoSuchPort
        with pytest.raises(RequestError) as one_side:
            engine.plan("ocs1", connect=[(1, 2)])  # both ingress: the driver's InvalidRequest
        assert not isinstance(one_side.value, NotFound)
        with pytest.raises(UnknownSwitch):
            engine.plan("nope", connect=[(1, 9)])
        await engine.reconfigure("ocs1", connect=[(1, 9)], verify_light=False)
        with pytest.raises(PortBusy):
            engine.plan("ocs1", connect=[(1, 10)])
        assert engine.intended["ocs1"] == {1: 9}

        async with httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as api:
            for pairs, status in (([[1, 99]], 404), ([[2, 3]], 422), ([[1, 10]], 409)):
                reply = await api.post("/v1/switches/ocs1/connections",
                                       json={"pairs": pairs, "verify_light": False})
                assert reply.status_code == status, (pairs, reply.text)
                assert reply.json()["detail"]
        assert engine.intended["ocs1"] == {1: 9}
        truth = await rig.backdoor.truth("ocs1")
        assert dict(map(tuple, truth["state"]["connections"])) == {1: 9}


async def _recorded(store: Store) -> int:
    return int(await store.read(lambda s: s.scalar(
        select(func.count()).select_from(Reconfiguration))))


async def test_a_change_the_store_refuses_is_refused_and_undone(start_rig: StartRig) -> None:
    async with start_rig("refuse", switch(size="8x8", switch_ms=1), token=TOKEN) as rig:
        engine, store = rig.daemon.engine, rig.daemon.store
        await engine.reconfigure("ocs1", connect=[(1, 9)], verify_light=False)
        before = await _recorded(store)
        _, heard = rig.daemon.hub.subscribe()
        with refusing(store, "read-only"):
            # The device acknowledged, the store refused: no acknowledgement, the switch
            # put back, nothing recorded.
            with pytest.raises(StoreUnavailable, match="ocs1: the change is refused") as info:
                await engine.reconfigure("ocs1", connect=[(2, 10)], disconnect=[1],
                                         verify_light=False)
            assert "put back" in str(info.value)
            # Announced as a warning, never as a reconfiguration.
            kinds = []
            while not heard.queue.empty():
                event = heard.queue.get_nowait()
                assert event is not None
                kinds.append((event.kind, event.data.get("detail")))
            assert ("warning", str(info.value)) in kinds
            assert "reconfiguration" not in {kind for kind, _ in kinds}
            heard.close()
            assert engine.intended["ocs1"] == {1: 9}
            truth = await rig.backdoor.truth("ocs1")
            assert dict(map(tuple, truth["state"]["connections"])) == {1: 9}
            # Once the store has refused, a request is refused before the device is touched.
            async with httpx.AsyncClient(base_url=rig.daemon.url, headers=AUTH) as api:
                reply = await api.post("/v1/switches/ocs1/connections",
                                       json={"pairs": [[3, 11]], "verify_light": False})
            assert reply.status_code == 503, reply.text
            assert "refused" in reply.json()["detail"]
            truth = await rig.backdoor.truth("ocs1")
            assert dict(map(tuple, truth["state"]["connections"])) == {1: 9}
            assert await _recorded(store) == before
        # The store takes writes again: so does the switch.
        await engine.reconfigure("ocs1", connect=[(2, 10)], verify_light=False)
        assert engine.intended["ocs1"] == {1: 9, 2: 10}
        assert await store.intended() == {"ocs1": {1: 9, 2: 10}}
        assert await _recorded(store) == before + 1


async def test_a_whole_map_the_store_refuses_is_put_back(start_rig: StartRig) -> None:
    async with start_rig("refusemap", switch(size="8x8", switch_ms=1), token=TOKEN) as rig:
        engine, store = rig.daemon.engine, rig.daemon.store
        await engine.reconfigure("ocs1", replace={1: 9, 2: 10}, verify_light=False)
        with refusing(store, "read-only"), pytest.raises(StoreUnavailable):
            await engine.reconfigure("ocs1", replace={i: i + 8 for i in range(1, 9)},
                                     verify_light=False)
        assert engine.intended["ocs1"] == {1: 9, 2: 10}
        truth = await rig.backdoor.truth("ocs1")
        assert dict(map(tuple, truth["state"]["connections"])) == {1: 9, 2: 10}
        assert await store.intended() == {"ocs1": {1: 9, 2: 10}}
