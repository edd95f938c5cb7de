"""A long-lived command stops on SIGTERM even when its event loop is flooded with
thread-safe callbacks (thousands of MQTT clients in ``labd emulate``, each waking the loop):
asyncio's own signal handling carries the signal through the loop's self-pipe, which such a
flood fills, and the signal was lost — the process never stopped."""

from __future__ import annotations

import asyncio
import signal
import sys

from labd import deadlines

FLOODED = """
import asyncio, sys, threading
from labd.terminal import run_until_signalled

async def body(stop):
    loop = asyncio.get_running_loop()
    done = threading.Event()

    def flood():
        while not done.is_set():
            for _ in range(1000):
                loop.call_soon_threadsafe(int)

    threading.Thread(target=flood, daemon=True).start()
    # Half a second of it: the loop's backlog of callbacks grows, and with it the wake-ups
    # written between two of its reads of the pipe, past what the pipe holds. (On the old
    # signal handling, run by hand, the signal was lost in about half the runs; under
    # pytest the race is rarely lost, so this guards the fix more than it proves the bug.)
    await asyncio.sleep(0.5)
    print("ready", flush=True)
    await stop.wait()
    done.set()
    print("stopped", flush=True)

# spawns: asyncio's own loop (the one that lost the signal), as labd emulate with hosts runs
run_until_signalled("the flood", body, spawns=True)
"""


async def test_sigterm_stops_a_command_whose_loop_is_flooded() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FLOODED, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    assert process.stdout is not None and process.stderr is not None
    try:
        wait = deadlines.current().of("process_ready")
        assert await asyncio.wait_for(process.stdout.readline(), wait) == b"ready\n"
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.stdout.readline(), wait) == b"stopped\n"
        assert await asyncio.wait_for(process.wait(), wait) == 0
        assert b"wakeup fd" not in await process.stderr.read()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
