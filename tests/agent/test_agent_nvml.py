"""The NVML backend. Where the machine has no NVIDIA driver (CI), the real nvidia-ml-py
must say so clearly; the reading of NVML's answers is checked against a stand-in module
that answers as NVML does for a healthy GPU, an unsupported field, a lost GPU, and an Xid
event (there is no GPU here to make those happen)."""

import asyncio
import threading
import types
from typing import Any

import pytest

from labd.agent.health import Health, classify_host
from labd.agent.nvml import NvmlBackend
from labd.errors import NvmlUnavailable


def test_real_nvml_reports_or_explains_why_not() -> None:
    try:
        backend = NvmlBackend()
    except NvmlUnavailable as exc:
        assert "NVIDIA driver" in str(exc) and "--backend nvidia-smi" in str(exc)
        return
    try:  # a machine with a GPU: it must be read
        gpus, _ = asyncio.run(backend.gpus())
        assert gpus and all(g.uuid.startswith("GPU-") for g in gpus)
    finally:
        backend.close()


def stand_in(lost: set[int], xid: tuple[int, int] | None = None) -> types.SimpleNamespace:
    class NVMLError(Exception):
        pass

    class NotSupported(NVMLError):
        pass

    class GpuIsLost(NVMLError):
        pass

    class Timeout(NVMLError):
        pass

    fired = threading.Event()

    def handle(index: int) -> int:
        if index in lost:
            raise GpuIsLost("GPU is lost")
        return index

    def wait(_events: Any, _ms: int) -> Any:
        if xid is None or fired.is_set():
            fired.wait(0.05)
            raise Timeout("timeout")
        fired.set()
        return types.SimpleNamespace(device=xid[0], eventData=xid[1])

    def unsupported(*_: Any) -> Any:
        raise NotSupported("not supported")

    return types.SimpleNamespace(
        NVMLError=NVMLError, NVMLError_NotSupported=NotSupported, NVMLError_GpuIsLost=GpuIsLost,
        NVMLError_Timeout=Timeout, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0,
        NVML_FEATURE_ENABLED=1, NVML_TEMPERATURE_GPU=0, nvmlEventTypeXidCriticalError=8,
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 3,
        nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetUUID=lambda h: f"GPU-{h:04d}".encode(),
        nvmlDeviceGetName=lambda h: b"NVIDIA H200",
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"00000000:{h:02X}:00.0"),
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: 2 if h == 2 else 0,
        nvmlDeviceGetRemappedRows=lambda h: (0, 0, 0, 0),
        nvmlDeviceGetRetiredPagesPendingStatus=unsupported,
        nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x1,
        nvmlDeviceGetTemperature=lambda h, sensor: 41,
        nvmlDeviceGetPowerUsage=lambda h: 123_456,
        nvmlDeviceGetUtilizationRates=unsupported,
        nvmlEventSetCreate=lambda: object(), nvmlDeviceRegisterEvents=lambda h, mask, es: None,
        nvmlEventSetWait_v2=wait)


async def test_answers_are_read_and_classified() -> None:
    backend = NvmlBackend(stand_in(lost={1}))  # type: ignore[arg-type]
    try:
        gpus, lost = await backend.gpus()
        assert lost
        healthy, gone, _ = gpus
        assert (healthy.uuid, healthy.name, healthy.bus_id) == (
            "GPU-0000", "NVIDIA H200", "00000000:00:00.0")
        assert healthy.power_w == pytest.approx(123.456) and healthy.temperature_c == 41
        assert healthy.retired_pending is None and healthy.utilization_pct is None  # [N/A]
        assert gone.lost
        verdicts = classify_host(gpus, 3)
        assert [verdicts[i].health for i in range(3)] == [Health.HEALTHY, Health.FAILED,
                                                          Health.FAILED]
    finally:
        backend.close()


async def test_an_xid_event_wakes_the_agent_and_fails_the_gpu() -> None:
    backend = NvmlBackend(stand_in(lost=set(), xid=(0, 79)))  # type: ignore[arg-type]
    try:
        await backend.gpus()  # starts the event watcher
        # Only the event can end this wait: its own timeout is an hour away.
        await asyncio.wait_for(backend.wait_change(timeout=3600), 30)
        gpus, _ = await backend.gpus()
        assert gpus[0].xids == [79]
        assert classify_host(gpus, 3)[0].health is Health.FAILED
    finally:
        backend.close()


def test_without_nvidia_ml_py_the_message_says_what_to_install(monkeypatch: Any) -> None:
    import builtins

    real = builtins.__import__

    def no_pynvml(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "pynvml":
            raise ImportError(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pynvml)
    with pytest.raises(NvmlUnavailable, match=r"labd\[nvml\]"):
        NvmlBackend()
