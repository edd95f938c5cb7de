from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from emulators import EmulatedLab, EmulatorSpec
from emulators.lab import ServeSpec

FAST = {"switch_time_ms": 2.0, "jitter_ms": 0.5}


@pytest.fixture
async def lab() -> AsyncIterator[EmulatedLab]:
    """A Polatis 16x16 (SCPI + TL1) and a CALIENT with 64 ports, switching in ~2 ms."""
    specs = [
        EmulatorSpec("ocs1", "polatis", {"size": "16x16"}, dict(FAST)),
        EmulatorSpec("cal", "calient", {"ports": 64, "users": {"admin": "secret"}}, dict(FAST)),
        EmulatorSpec("ocspty", "polatis", {"size": "8x8"}, dict(FAST),
                     serve={"scpi": ServeSpec(serve="pty")}),
    ]
    async with EmulatedLab(specs) as emulated:
        yield emulated
