"""Hardware-in-the-loop: the same capability checks against a real lab file.

Skipped unless ``LABD_HIL_LAB`` names a lab file. Read-only by default; with
``LABD_HIL_PAIR=<switch-id>:<a>,<b>`` it also makes and breaks that one pair, which must be
free and safe to light on that switch.
"""

import os

import pytest

from labd.fabric.drivers import make_switch
from labd.lab.file import SWITCH_ENTRIES, load_lab

LAB = os.environ.get("LABD_HIL_LAB")
pytestmark = [pytest.mark.hil,
              pytest.mark.skipif(not LAB, reason="set LABD_HIL_LAB to a real lab file")]


def switches() -> list[str]:
    if not LAB:
        return []
    return [e.id for e in load_lab(LAB).instrument
            if isinstance(e, SWITCH_ENTRIES) and not e.emulate]


@pytest.mark.parametrize("switch_id", switches())
async def test_identify_and_read(switch_id: str) -> None:
    assert LAB is not None
    entry = load_lab(LAB).get(switch_id)
    async with make_switch(entry) as sw:
        assert sw.info is not None and sw.info.ports > 0
        found = await sw.cross_connects()
        assert all(1 <= p <= sw.info.ports for pair in found.items() for p in pair)
        states = await sw.port_states()
        assert len(states) == sw.info.ports


@pytest.mark.skipif("LABD_HIL_PAIR" not in os.environ, reason="set LABD_HIL_PAIR to change")
async def test_make_and_break_one_pair() -> None:
    assert LAB is not None
    switch_id, _, pair = os.environ["LABD_HIL_PAIR"].partition(":")
    a, b = (int(x) for x in pair.split(","))
    async with make_switch(load_lab(LAB).get(switch_id)) as sw:
        await sw.connect([(a, b)])
        assert (await sw.cross_connects()).get(min(a, b)) == max(a, b)
        await sw.disconnect([a])
        assert min(a, b) not in await sw.cross_connects()
