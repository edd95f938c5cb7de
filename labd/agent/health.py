"""GPU health: what each backend reports, and how it is classified.

The rules follow docs/protocols.md §6.2: an uncorrectable ECC error, a failed row remap, a lost
GPU (nvidia-smi exit 15, NVML_ERROR_GPU_IS_LOST), a critical Xid (46, 48, 79, 64, 95, 74,
119, 120) or a GPU missing from the expected count is *failed*; a pending remap or page
retirement, or hardware slowdown (thermal, power brake) is *degraded*; anything else healthy.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field

#: Xid codes after which the GPU must be drained (reset or replaced).
CRITICAL_XID = frozenset({46, 48, 64, 74, 79, 95, 119, 120})
#: Xid codes that are usually the application's fault: noted, not a GPU failure.
APPLICATION_XID = frozenset({13, 31, 43, 45, 94})
#: clocks_throttle_reasons.active bits that mean the hardware is slowing itself down.
HW_SLOWDOWN = 0x8 | 0x40 | 0x80  # HW slowdown, HW thermal, HW power brake

_XID = re.compile(r"NVRM: Xid \(PCI:(?P<bus>[0-9a-fA-F:.]+)\): (?P<code>\d+)")


class Health(enum.StrEnum):
    HEALTHY = "healthy"
    DEGRADED = "degraded"
    FAILED = "failed"


@dataclass
class GpuStatus:
    """One GPU as a backend saw it. None means the backend could not tell ([N/A])."""

    index: int
    uuid: str = ""
    name: str = ""
    bus_id: str = ""
    lost: bool = False
    ecc_uncorrected: int | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    retired_pending: bool | None = None
    throttle_reasons: int | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    utilization_pct: float | None = None
    xids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Verdict:
    health: Health
    reasons: tuple[str, ...] = ()


def classify(gpu: GpuStatus) -> Verdict:
    failed, degraded = [], []
    if gpu.lost:
        failed.append("GPU is lost (fallen off the bus)")
    if gpu.ecc_uncorrected:
        failed.append(f"{gpu.ecc_uncorrected} uncorrectable ECC error(s)")
    if gpu.remap_failed:
        failed.append("row remapping failed")
    for xid in gpu.xids:
        if xid in CRITICAL_XID:
            failed.append(f"Xid {xid}")
    if gpu.remap_pending:
        degraded.append("row remap pending (needs a GPU reset)")
    if gpu.retired_pending:
        degraded.append("page retirement pending")
    if gpu.throttle_reasons is not None and gpu.throttle_reasons & HW_SLOWDOWN:
        degraded.append(f"hardware slowdown (throttle reasons {gpu.throttle_reasons:#x})")
    if failed:
        return Verdict(Health.FAILED, tuple(failed + degraded))
    if degraded:
        return Verdict(Health.DEGRADED, tuple(degraded))
    return Verdict(Health.HEALTHY)


def classify_host(gpus: list[GpuStatus], expected: int | None) -> dict[int, Verdict]:
    """Every GPU's verdict; GPUs the host should have but did not report are failed."""
    verdicts = {gpu.index: classify(gpu) for gpu in gpus}
    if expected is not None:
        for index in range(expected):
            if index not in verdicts:
                verdicts[index] = Verdict(Health.FAILED, ("GPU missing",))
    return verdicts


def parse_xid(line: str) -> tuple[str, int] | None:
    """A kernel log line ``NVRM: Xid (PCI:0000:3b:00): 79, ...`` → (bus id, code)."""
    match = _XID.search(line)
    if not match:
        return None
    return match.group("bus").lower(), int(match.group("code"))
