"""A CALIENT change cut off between its two phases (ENT-CRS, then ACT-CRS) leaves nothing of
labd's behind: connections it entered and never activated would hold their ports, and every
later connect on them would be refused as 'in use'."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from emulators import EmulatedLab
from instruments import DeviceError, InstrumentError
from instruments.calient import CalientTl1
from instruments.connection import Backoff
from instruments.link import LinkSettings


@asynccontextmanager
async def calient(lab: EmulatedLab, **options: Any) -> AsyncIterator[CalientTl1]:
    sw = CalientTl1(lab.endpoints["cal"]["tl1"], name="cal", user="admin", password="secret",
                    backoff=Backoff(initial=0.01, maximum=0.05),
                    settings=LinkSettings(write_termination="\r\n", timeout=1.0), **options)
    async with sw:
        yield sw


async def test_a_connection_lost_between_the_phases_is_tidied_before_the_next_connect(
        lab: EmulatedLab) -> None:
    async with calient(lab) as sw:
        lab.inject("cal", {"kind": "drop", "apply": True})  # ENT-CRS done, then cut
        with pytest.raises(InstrumentError):
            await sw.connect([(1, 40)])
        await sw.connection.wait_online(timeout=10)
        assert await sw.provisioned() == [(1, 40)]  # what a real switch would hold too
        await sw.connect([(1, 40)])  # before: "port 1.1.1 in use", for good
        assert await sw.cross_connects() == {1: 40}
        assert await sw.provisioned() == []


async def test_a_refused_entry_takes_back_the_entries_before_it(lab: EmulatedLab) -> None:
    async with calient(lab, aid_lists=False) as sw:  # one ENT-CRS per pair
        lab.inject("cal", {"kind": "fail_port", "port": 41})
        with pytest.raises(DeviceError, match="has failed"):
            await sw.connect([(1, 40), (2, 41)])
        assert await sw.provisioned() == []
        assert await sw.cross_connects() == {}


async def test_provisioned_connections_of_others_are_left_alone(lab: EmulatedLab) -> None:
    async with calient(lab) as sw:
        await sw._run(lambda link: sw._cmd(link, "ENT-CRS", "1.1.5,1.2.5", "SYSTEM,2WAY"))
        lab.inject("cal", {"kind": "drop", "apply": True})
        with pytest.raises(InstrumentError):
            await sw.connect([(1, 40)])
        await sw.connection.wait_online(timeout=10)
        await sw.connect([(1, 40)])
        assert sorted(await sw.provisioned()) == [(5, 37)]  # an operator's: still there
