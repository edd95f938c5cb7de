"""Where the agent's GPU health comes from: nvidia-smi, or an emulated host (for
``labd emulate`` and tests) whose GPUs fail when told to."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Protocol

from labd.agent.health import GpuStatus
from labd.agent.smi import query

#: Emulated failure signals, by name (docs/protocols.md §6.2).
SIGNALS = ("xid79", "xid48", "xid46", "ecc", "remap-failed", "remap-pending", "lost",
           "thermal")


class Backend(Protocol):
    async def gpus(self) -> tuple[list[GpuStatus], bool]:
        """(the GPUs that answered, whether any GPU is reported lost)."""
        ...

    async def wait_change(self, timeout: float) -> None:
        """Return after ``timeout`` s, or sooner when the backend knows health changed."""
        ...

    def since_ns(self, gpu: int) -> int | None:
        """When a GPU's current failure began, where the backend knows (emulation)."""
        ...


class SmiBackend:
    def __init__(self, binary: str = "nvidia-smi") -> None:
        self.binary = binary

    async def gpus(self) -> tuple[list[GpuStatus], bool]:
        result = await query(self.binary)
        return result.gpus, result.lost_any

    async def wait_change(self, timeout: float) -> None:
        await asyncio.sleep(timeout)  # nvidia-smi can only be polled

    def since_ns(self, gpu: int) -> int | None:
        return None


@dataclass
class EmulatedBackend:
    """``count`` healthy H100s until :meth:`fail` says otherwise."""

    count: int = 8
    seed: int = 0
    failures: dict[int, str] = field(default_factory=dict)
    frozen: bool = False
    """A hung host: reads never return (no more heartbeats)."""
    failed_at: dict[int, int] = field(default_factory=dict)
    """When each failure was injected (CLOCK_MONOTONIC ns): the ground truth."""
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _thawed: asyncio.Event = field(default_factory=asyncio.Event)

    def freeze(self, frozen: bool) -> None:
        self.frozen = frozen
        if frozen:
            self._thawed.clear()
        else:
            self._thawed.set()

    def fail(self, gpu: int, signal: str) -> int:
        """Inject a failure; returns when it happened (CLOCK_MONOTONIC ns)."""
        if signal not in SIGNALS:
            raise ValueError(f"signal {signal!r}: expected one of {', '.join(SIGNALS)}")
        if not 0 <= gpu < self.count:
            raise ValueError(f"GPU {gpu}: this host has GPUs 0..{self.count - 1}")
        self.failures[gpu] = signal
        self.failed_at[gpu] = time.monotonic_ns()
        # Like an NVML Xid event wait, the agent hears of it at once rather than at its
        # next poll.
        self._changed.set()
        return self.failed_at[gpu]

    def heal(self, gpu: int | None = None) -> None:
        for index in list(self.failures) if gpu is None else [gpu]:
            self.failures.pop(index, None)
            self.failed_at.pop(index, None)
        self._changed.set()

    async def wait_change(self, timeout: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
        # cancellation that lands as it times out, and the agent would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        self._changed.clear()

    def since_ns(self, gpu: int) -> int | None:
        return self.failed_at.get(gpu)

    async def gpus(self) -> tuple[list[GpuStatus], bool]:
        if self.frozen:
            await self._thawed.wait()  # the host is gone until revived
        rng = random.Random(self.seed)
        out = []
        for index in range(self.count):
            signal = self.failures.get(index)
            if signal == "lost":
                continue  # fallen off the bus: it no longer answers
            gpu = GpuStatus(index, uuid=f"GPU-emulated-{self.seed:04x}-{index:02d}",
                            name="NVIDIA H100 80GB HBM3 (emulated)",
                            bus_id=f"00000000:{0x18 + 0x10 * index:02X}:00.0",
                            ecc_uncorrected=0, remap_pending=False, remap_failed=False,
                            throttle_reasons=0, temperature_c=35 + rng.random() * 5,
                            power_w=70 + rng.random() * 10, utilization_pct=0)
            if signal and signal.startswith("xid"):
                gpu.xids.append(int(signal[3:]))
            elif signal == "ecc":
                gpu.ecc_uncorrected = 1
            elif signal == "remap-failed":
                gpu.remap_failed = True
            elif signal == "remap-pending":
                gpu.remap_pending = True
            elif signal == "thermal":
                gpu.throttle_reasons = 0x40
            out.append(gpu)
        return out, "lost" in self.failures.values()
