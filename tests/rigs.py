"""The tests' one way to start an emulated rig (emulators, emulated hosts, a daemon on
them) on a lab file written for the test: ``rig_on`` (the ``start_rig`` fixture of
conftest.py), and ``background_rig``, the same served from a thread with an event loop of
its own, as a daemon runs beside a UI in another process: the UI's work cannot hold the
daemon up, nor the daemon's the UI."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, Protocol

from labd import deadlines
from labd.daemon.core import Daemon
from labd.emulation.rig import Rig, emulated_rig
from labd.events import Event, Subscription
from labd.lab.loader import load_lab
from labd.mqtt.credentials import BusSettings
from tests.broker import require_broker
from tests.labs import write_lab

#: The admin token the tests give their rigs (``token="t"``), as a request's header.
AUTH = {"Authorization": "Bearer t"}


@contextlib.asynccontextmanager
async def rig_on(tmp_path: Path, tag: str, *parts: str, mqtt: str | BusSettings | None = None,
                 name: str | None = None, **options: Any) -> AsyncIterator[Rig]:
    """An emulated rig on a lab of ``parts`` (tests.labs) written in ``tmp_path`` under a
    name no other run uses (or ``name``), its store there too; with ``mqtt``, on that
    broker, which must be listening. ``options`` are emulated_rig's (token, restore,
    light_window_s, apart, hosts, tidy, port)."""
    if mqtt is not None:
        require_broker()
    _, path = write_lab(tmp_path, tag, *parts, name=name)
    async with emulated_rig(load_lab(path), db=str(tmp_path / "s.sqlite"), mqtt=mqtt,
                            **options) as rig:
        yield rig


class StartRig(Protocol):
    """The ``start_rig`` fixture: ``rig_on`` in the test's ``tmp_path``.

        async with start_rig("camp", switch(switch_ms=1), token="t") as rig: ...
    """

    def __call__(self, tag: str, *parts: str, mqtt: str | BusSettings | None = None,
                 name: str | None = None, **options: Any
                 ) -> contextlib.AbstractAsyncContextManager[Rig]: ...


class Background:
    """The rig and the loop it runs on; its daemon can be read from the test's thread
    (what the UI has shown the daemon has already done)."""

    def __init__(self, rig: Rig, loop: asyncio.AbstractEventLoop) -> None:
        self.rig, self.loop = rig, loop

    @property
    def daemon(self) -> Daemon:
        return self.rig.daemon

    def run(self, work: Callable[[Rig], Coroutine[Any, Any, Any]]) -> Any:
        """Run ``work(rig)`` on the rig's loop and wait for it (blocking this thread)."""
        future = asyncio.run_coroutine_threadsafe(work(self.rig), self.loop)
        return future.result(deadlines.current().times(60))

    async def call(self, work: Callable[[Rig], Coroutine[Any, Any, Any]]) -> Any:
        """Run ``work(rig)`` on the rig's loop, awaited from another loop."""
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(work(self.rig), self.loop))


@contextlib.contextmanager
def background_rig(tmp_path: Path, tag: str, *parts: str, **options: Any
                   ) -> Iterator[Background]:
    """``rig_on`` served from a thread (the admin token ``t``); ``options`` are
    emulated_rig's."""
    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        box["stop"] = asyncio.Event()
        async with rig_on(tmp_path, tag, *parts, token="t", **options) as rig:
            box["bg"] = Background(rig, asyncio.get_running_loop())
            started.set()
            await box["stop"].wait()

    def main() -> None:
        try:
            asyncio.run(serve())
        except BaseException as error:  # told in the test's thread, which is waiting
            box["error"] = error
            raise
        finally:
            started.set()

    thread = threading.Thread(target=main, name="rig", daemon=True)
    thread.start()
    assert started.wait(deadlines.current().times(60)) and "bg" in box, \
        f"the emulated lab did not start: {box.get('error')!r}"
    background: Background = box["bg"]
    try:
        yield background
    finally:
        background.loop.call_soon_threadsafe(box["stop"].set)
        thread.join(deadlines.current().times(60))


async def next_event(sub: Subscription, kind: str, timeout: float = 15) -> Event:
    """The next ``kind`` event on a subscription to the daemon's event stream (``timeout``
    on the suite's deadline scale, tests/conftest.py)."""
    async with asyncio.timeout(deadlines.current().times(timeout)):
        while True:
            event = await sub.next()
            if event is not None and event.kind == kind:
                return event
