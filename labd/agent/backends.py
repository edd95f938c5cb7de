"""Where the agent's GPU health comes from: nvidia-smi, or an emulated host (for
``labd emulate`` and tests) whose GPUs fail when told to."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from typing import Protocol

from labd.agent.health import GpuStatus
from labd.agent.smi import query

#: Emulated failure signals, by name (protocols.md §6.2).
SIGNALS = ("xid79", "xid48", "xid46", "ecc", "remap-failed", "remap-pending", "lost",
           "thermal")


class Backend(Protocol):
    async def gpus(self) -> tuple[list[GpuStatus], bool]:
        """(the GPUs that answered, whether any GPU is reported lost)."""
        ...


class SmiBackend:
    def __init__(self, binary: str = "nvidia-smi") -> None:
        self.binary = binary

    async def gpus(self) -> tuple[list[GpuStatus], bool]:
        result = await query(self.binary)
        return result.gpus, result.lost_any


@dataclass
class EmulatedBackend:
    """``count`` healthy H100s until :meth:`fail` says otherwise."""

    count: int = 8
    seed: int = 0
    failures: dict[int, str] = field(default_factory=dict)
    frozen: bool = False
    """A hung host: reads never return (no more heartbeats)."""

    def fail(self, gpu: int, signal: str) -> None:
        if signal not in SIGNALS:
            raise ValueError(f"signal {signal!r}: expected one of {', '.join(SIGNALS)}")
        if not 0 <= gpu < self.count:
            raise ValueError(f"GPU {gpu}: this host has GPUs 0..{self.count - 1}")
        self.failures[gpu] = signal

    def heal(self, gpu: int | None = None) -> None:
        if gpu is None:
            self.failures.clear()
        else:
            self.failures.pop(gpu, None)

    async def gpus(self) -> tuple[list[GpuStatus], bool]:
        if self.frozen:
            await asyncio.Event().wait()  # never: the host is gone
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
