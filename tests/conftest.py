from __future__ import annotations

import asyncio
import functools
import os
import signal
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from emulators import EmulatedLab, EmulatorSpec
from emulators.lab import ServeSpec
from labd import deadlines
from labd.deadlines import SCALE_ENV
from tests import broker
from tests.rigs import StartRig, rig_on

FAST = {"switch_time_ms": 2.0, "jitter_ms": 0.5}

# Two cores shared with other work make every process slow at once: the suite's waits (and
# those of the labd processes it starts, which inherit the environment) are three times
# the defaults unless the environment says otherwise. Waits end on evidence; a deadline
# only bounds how long a broken one hangs.
os.environ.setdefault(SCALE_ENV, "3")

# A shell starts a background job (``cmd &``) with SIGINT ignored, and an ignored signal
# stays ignored across exec: the labd processes the tests interrupt (Ctrl-C keeps a
# measurement) would never hear it. The suite's children get the default, as from a
# terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-timeout's backstop (the ini's ``timeout`` or a test's own mark) on the same
    scale as the deadlines."""
    scale = deadlines.current().scale
    if scale == 1:
        return
    default = float(config.getini("timeout") or 0)
    for item in items:
        mark = item.get_closest_marker("timeout")
        seconds = float(mark.args[0]) if mark is not None and mark.args else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(seconds * scale), append=False)


@pytest.fixture(scope="session", autouse=True)
def _shared_broker_stops() -> Iterator[None]:
    """The session's shared broker (tests.broker.MQTT), if a test started it, ends with
    the session."""
    yield
    broker.SHARED.close()


@pytest.fixture
def shared_broker() -> broker.Mosquitto:
    """The session's shared broker, running (tests.broker.require_broker)."""
    return broker.require_broker()


@pytest.fixture
def mqtt_url(shared_broker: broker.Mosquitto) -> str:
    """``mqtt://127.0.0.1:PORT`` of the session's shared broker, running."""
    return shared_broker.url


@pytest.fixture
def private_broker(tmp_path: Path) -> Iterator[broker.Mosquitto]:
    """A broker of the test's own, started, its config and log in ``tmp_path``; the test
    may stop and start it (the same port)."""
    with broker.Mosquitto(tmp_path / "broker") as mine:
        yield mine


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


@pytest.fixture
def start_rig(tmp_path: Path) -> StartRig:
    """Start an emulated rig on a lab written for the test (tests.rigs.rig_on):

        async with start_rig("camp", switch(switch_ms=1), mqtt=MQTT, token="t") as rig:
    """
    return functools.partial(rig_on, tmp_path)


#: Modules whose async tests run on the standard loop and on uvloop (what `labd` runs on).
BOTH_LOOPS = {"test_drivers_emulated", "test_transports"}


def pytest_asyncio_loop_factories(config: pytest.Config, item: pytest.Item) -> dict[
        str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop}
    module = getattr(item, "module", None)
    if module is not None and module.__name__.rsplit(".", 1)[-1] in BOTH_LOOPS:
        try:
            import uvloop
        except ImportError:
            return factories
        factories["uvloop"] = uvloop.new_event_loop
    return factories


def _dump_tasks(*_: object) -> None:
    """SIGUSR1: print every asyncio task's stack (to see what a stuck test awaits)."""
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:
        return
    for task in tasks:
        task.print_stack(limit=12, file=sys.stderr)


signal.signal(signal.SIGUSR1, _dump_tasks)
