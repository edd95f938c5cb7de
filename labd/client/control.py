"""A client of an emulated lab's control endpoint (the "backdoor"): ground truth, faults,
timing. labd's own tools (the demo, the benchmarks) reach emulators only through it, the
same way a CI job would, so they work on emulators in another process as well as this one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from labd import deadlines
from labd.client.api import call_json
from labd.errors import BackdoorError


class Backdoor:
    def __init__(self, url: str, *, timeout: float | None = None) -> None:
        """``timeout``: per request, in s (default: the ``control_call`` deadline)."""
        self.url = url
        self._http = httpx.AsyncClient(
            base_url=url,
            timeout=deadlines.current().of("control_call") if timeout is None else timeout)

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        return await call_json(self._http, method, path, BackdoorError, **kwargs)

    async def truth(self, emulator: str, since: int = 0, *, light: bool = False
                    ) -> dict[str, Any]:
        result: dict[str, Any] = await self._call(
            "GET", f"/v1/emulators/{emulator}/truth",
            params={"since": since, "light": str(light).lower()})
        return result

    async def light(self, since: int = 0) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = await self._call("GET", "/v1/light",
                                                        params={"since": since})
        return result

    async def inject(self, emulator: str, fault: dict[str, Any]) -> None:
        await self._call("POST", f"/v1/emulators/{emulator}/faults", json=fault)

    async def clear_faults(self, emulator: str) -> None:
        await self._call("DELETE", f"/v1/emulators/{emulator}/faults")

    async def describe(self, emulator: str) -> dict[str, Any]:
        """An emulator's kind, endpoints, timing model (switches), faults and state."""
        result: dict[str, Any] = await self._call("GET", f"/v1/emulators/{emulator}")
        return result

    async def set_timing(self, emulator: str, **values: float) -> None:
        await self._call("PUT", f"/v1/emulators/{emulator}/timing", json=values)

    async def power(self, emulator: str, on: bool) -> None:
        """Power a device off (its endpoints stop listening, its connections are cut) or on
        again (same addresses; its state as it boots)."""
        await self._call("PUT", f"/v1/emulators/{emulator}/power", json={"on": on})

    async def fail_gpu(self, host: str, gpu: int, signal: str) -> int:
        """Fail an emulated GPU; returns when it failed (CLOCK_MONOTONIC ns)."""
        reply = await self._call("POST", f"/v1/hosts/{host}/fail",
                                 json={"gpu": gpu, "signal": signal})
        return int(reply["injected_ns"])

    async def heal(self, host: str, gpu: int | None = None) -> None:
        await self._call("POST", f"/v1/hosts/{host}/heal",
                         params={} if gpu is None else {"gpu": gpu})

    async def kill_host(self, host: str) -> int:
        """Kill an emulated host; returns when (CLOCK_MONOTONIC ns)."""
        reply = await self._call("POST", f"/v1/hosts/{host}/kill")
        return int(reply["injected_ns"])

    async def revive_host(self, host: str) -> None:
        await self._call("POST", f"/v1/hosts/{host}/revive")


#: How much of a ``labd emulate`` process's stderr is kept to explain its end.
STDERR_TAIL = 40
#: How long ``labd emulate`` has to stop on SIGTERM before it is killed.
STOP_GRACE_S = 10.0


@dataclass
class EmulatorProcess:
    """``labd emulate`` running in its own process. Its output is read for as long as it
    runs (a child whose pipe is full stops in its next write), the last lines of its stderr
    kept for the message should it fail."""

    process: asyncio.subprocess.Process
    endpoints: dict[str, str]
    control: str
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    stderr: deque[str] = field(default_factory=lambda: deque(maxlen=STDERR_TAIL))

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            try:
                async with asyncio.timeout(deadlines.current().times(STOP_GRACE_S)):
                    await self.process.wait()
            except TimeoutError:  # it does not answer SIGTERM: it is stuck
                self.process.kill()
                await self.process.wait()
        for reader in self.readers:
            reader.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)


async def _drain(stream: asyncio.StreamReader | None, keep: deque[str] | None) -> None:
    if stream is None:
        return
    while line := await stream.readline():
        if keep is not None:
            keep.append(line.decode(errors="replace").rstrip())


async def spawn_emulators(lab: str | Path, *, timeout: float | None = None,
                          mqtt: str | None = None) -> EmulatorProcess:
    """Start ``labd emulate LAB`` (with its emulated hosts reporting to ``mqtt``) and wait
    for its ready line, up to ``timeout`` s (default: the ``process_ready`` deadline)."""
    timeout = deadlines.current().of("process_ready") if timeout is None else timeout
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", "emulate", str(lab), *(["--mqtt", mqtt] if mqtt else []),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    spawned = EmulatorProcess(process, {}, "")
    spawned.readers.append(asyncio.create_task(_drain(process.stderr, spawned.stderr),
                                               name="labd-emulate-stderr"))
    try:
        async with asyncio.timeout(timeout):
            await _ready(process.stdout, spawned, lab)
    except TimeoutError:
        await spawned.stop()
        raise BackdoorError(deadlines.timed_out(timeout, f"labd emulate {lab} to print its "
                                                         "ready line")
                            + _tail(spawned)) from None
    except BaseException:
        await spawned.stop()
        raise
    spawned.readers.append(asyncio.create_task(_drain(process.stdout, None),
                                               name="labd-emulate-stdout"))
    return spawned


async def _ready(stdout: asyncio.StreamReader, spawned: EmulatorProcess, lab: str | Path
                 ) -> None:
    while True:
        line = await stdout.readline()
        if not line:
            await spawned.process.wait()
            # Its stderr to the end: why it stopped.
            await asyncio.gather(*spawned.readers, return_exceptions=True)
            raise BackdoorError(f"labd emulate {lab} exited (status "
                                f"{spawned.process.returncode}) before it was ready"
                                + _tail(spawned))
        try:
            data = json.loads(line)
        except ValueError:
            continue  # not an announcement (a library's print); the JSON lines are
        if not isinstance(data, dict):
            continue
        if data.get("ready"):
            spawned.control = str(data["control"])
            return
        if data.get("driver") != "agent":  # emulated hosts have no address
            spawned.endpoints[str(data["id"])] = str(data["endpoint"])


def _tail(spawned: EmulatorProcess) -> str:
    return (": " + "\n".join(spawned.stderr)) if spawned.stderr else ""
