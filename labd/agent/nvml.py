"""GPU health from NVML (nvidia-ml-py), where a driver is present.

Reads what docs/protocols.md §6.2 classifies on: uncorrectable volatile ECC errors, remapped
rows (pending, failed), pending page retirement, clock-event (throttle) reasons, and a GPU
that is lost. Critical Xid events come from an NVML event set, waited on in a thread, so a
failure reaches the agent as it happens rather than at its next poll; an Xid, once seen,
stands until the agent restarts (the GPU needs a reset or replacing either way).

NVML calls block: they run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from types import ModuleType
from typing import Any

from labd.agent.health import GpuStatus
from labd.errors import NvmlUnavailable


def _load() -> ModuleType:
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailable("the NVML backend needs nvidia-ml-py: pip install "
                              "'labd[nvml]', or use --backend nvidia-smi") from None
    module: ModuleType = pynvml
    return module


class NvmlBackend:
    def __init__(self, nvml: ModuleType | None = None) -> None:
        self.nvml = nvml or _load()
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            raise NvmlUnavailable(f"NVML cannot start ({exc}): is the NVIDIA driver loaded? "
                                  "Use --backend nvidia-smi or emulated otherwise") from None
        self.xids: dict[str, list[int]] = {}
        """Critical Xids seen, by GPU UUID."""
        self._changed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # -- reading ---------------------------------------------------------------------------
    def _value(self, call: Any, *args: Any) -> Any:
        """One NVML query; None where the GPU does not support it ([N/A])."""
        try:
            return call(*args)
        except self.nvml.NVMLError_NotSupported:
            return None

    def _read(self) -> tuple[list[GpuStatus], bool]:
        nvml = self.nvml
        out: list[GpuStatus] = []
        lost_any = False
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                out.append(self._read_one(index))
            except nvml.NVMLError_GpuIsLost:
                lost_any = True
                out.append(GpuStatus(index, lost=True))
        return out, lost_any

    def _read_one(self, index: int) -> GpuStatus:
        nvml = self.nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        gpu = GpuStatus(index, uuid=uuid, name=_text(nvml.nvmlDeviceGetName(handle)),
                        bus_id=_text(nvml.nvmlDeviceGetPciInfo(handle).busId))
        gpu.ecc_uncorrected = self._value(
            nvml.nvmlDeviceGetTotalEccErrors, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC)
        rows = self._value(nvml.nvmlDeviceGetRemappedRows, handle)
        if rows is not None:
            gpu.remap_pending, gpu.remap_failed = bool(rows[2]), bool(rows[3])
        pending = self._value(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
        if pending is not None:
            gpu.retired_pending = pending == nvml.NVML_FEATURE_ENABLED
        # Newer drivers call throttle reasons "clock event reasons".
        reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        gpu.throttle_reasons = self._value(reasons, handle)
        temperature = self._value(nvml.nvmlDeviceGetTemperature, handle,
                                  nvml.NVML_TEMPERATURE_GPU)
        gpu.temperature_c = None if temperature is None else float(temperature)
        power = self._value(nvml.nvmlDeviceGetPowerUsage, handle)
        gpu.power_w = None if power is None else power / 1000
        use = self._value(nvml.nvmlDeviceGetUtilizationRates, handle)
        gpu.utilization_pct = None if use is None else float(use.gpu)
        gpu.xids = list(self.xids.get(uuid, []))
        return gpu

    async def gpus(self) -> tuple[list[GpuStatus], bool]:
        self._start_watching()
        return await asyncio.to_thread(self._read)

    # -- events ----------------------------------------------------------------------------
    def _start_watching(self) -> None:
        if self._watcher is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._watcher = threading.Thread(target=self._watch, name="labd-nvml-events",
                                         daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        nvml = self.nvml
        try:
            events = nvml.nvmlEventSetCreate()
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                with contextlib.suppress(nvml.NVMLError_NotSupported):
                    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError,
                                                  events)
        except nvml.NVMLError:
            return  # no events here: the agent's polls still see ECC, remaps, lost GPUs
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(events, 500)
            except nvml.NVMLError_Timeout:
                continue
            except nvml.NVMLError:
                return
            uuid = _text(nvml.nvmlDeviceGetUUID(data.device))
            self.xids.setdefault(uuid, []).append(int(data.eventData))
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._changed.set)

    async def wait_change(self, timeout: float) -> None:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
        # cancellation that lands as it times out, and the agent would never stop.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._changed.wait()
        self._changed.clear()

    def since_ns(self, gpu: int) -> int | None:
        return None

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(self.nvml.NVMLError):
            self.nvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
