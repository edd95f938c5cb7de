"""A client of an emulated lab's control endpoint (the "backdoor"): ground truth, faults,
timing. labd's own tools (the demo, the benchmarks) reach emulators only through it, the
same way a CI job would, so they work on emulators in another process as well as this one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from labd.client.api import call_json
from labd.errors import BackdoorError


class Backdoor:
    def __init__(self, url: str) -> None:
        self.url = url
        self._http = httpx.AsyncClient(base_url=url, timeout=30)

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


@dataclass
class EmulatorProcess:
    """``labd emulate`` running in its own process."""

    process: asyncio.subprocess.Process
    endpoints: dict[str, str]
    control: str

    async def stop(self) -> None:
        if self.process.returncode is None:
            self.process.terminate()
            await self.process.wait()


async def spawn_emulators(lab: str | Path, *, timeout: float = 60,
                          mqtt: str | None = None) -> EmulatorProcess:
    """Start ``labd emulate LAB`` (with its emulated hosts reporting to ``mqtt``) and wait
    for its ready line."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "labd", "emulate", str(lab), *(["--mqtt", mqtt] if mqtt else []),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert process.stdout is not None
    endpoints: dict[str, str] = {}
    async with asyncio.timeout(timeout):
        while True:
            line = await process.stdout.readline()
            if not line:
                error = (await process.stderr.read()).decode() if process.stderr else ""
                raise BackdoorError(f"labd emulate {lab} exited before it was ready: {error}")
            data = json.loads(line)
            if data.get("ready"):
                return EmulatorProcess(process, endpoints, data["control"])
            if data.get("driver") != "agent":  # emulated hosts have no address
                endpoints[data["id"]] = data["endpoint"]
