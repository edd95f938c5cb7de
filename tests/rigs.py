"""An emulated rig (daemon, emulators, emulated hosts) served from a thread with an event
loop of its own, as a daemon runs beside a UI in another process: the UI's work cannot
hold the daemon up, nor the daemon's the UI."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

from labd.daemon.core import Daemon
from labd.emulation.drill import Rig, emulated_rig
from labd.lab.file import load_lab
from tests.broker import unique_lab


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
        return asyncio.run_coroutine_threadsafe(work(self.rig), self.loop).result(60)

    async def call(self, work: Callable[[Rig], Coroutine[Any, Any, Any]]) -> Any:
        """Run ``work(rig)`` on the rig's loop, awaited from another loop."""
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(work(self.rig), self.loop))


@contextlib.contextmanager
def background_rig(tmp_path: Path, tag: str, body: str) -> Iterator[Background]:
    _, path = unique_lab(tmp_path, tag, body)
    lab = load_lab(path)
    started = threading.Event()
    box: dict[str, Any] = {}

    async def serve() -> None:
        box["stop"] = asyncio.Event()
        async with emulated_rig(lab, db=str(tmp_path / "s.sqlite"), mqtt=None,
                                token="t") as rig:
            box["bg"] = Background(rig, asyncio.get_running_loop())
            started.set()
            await box["stop"].wait()

    def main() -> None:
        try:
            asyncio.run(serve())
        finally:
            started.set()

    thread = threading.Thread(target=main, name="rig", daemon=True)
    thread.start()
    assert started.wait(60) and "bg" in box, "the emulated lab did not start"
    background: Background = box["bg"]
    try:
        yield background
    finally:
        background.loop.call_soon_threadsafe(box["stop"].set)
        thread.join(60)
