"""The control endpoint ("backdoor") of an emulated lab: HTTP + JSON, for tests and HIL CI.

    GET    /v1/emulators                      every emulator, its endpoints, timing, faults
    GET    /v1/emulators/{id}                 one emulator with its current state
    GET    /v1/emulators/{id}/truth?since=N   true state, every physical change after N, and
                                              the light threshold crossings it caused or saw
    GET    /v1/light?since=N                  every threshold crossing at a meter channel
    POST   /v1/emulators/{id}/faults          inject: {"kind": "drop"|"stall"|"garbage"|
                                              "delay"|"fail_port"|"restore_port", "count",
                                              "delay_ms", "apply", "port", "now"}
    DELETE /v1/emulators/{id}/faults          clear every fault
    PUT    /v1/emulators/{id}/timing          {"switch_time_ms", "jitter_ms", "per_pair_ms", "seed"}
    PUT    /v1/emulators/{id}/power           {"on": false} cuts power, {"on": true} boots
    POST   /v1/emulators/{id}/reset           back to power-on defaults
    POST   /v1/reset                          reset every emulator
    GET    /v1/hosts                          emulated GPU hosts
    POST   /v1/hosts/{id}/fail                {"gpu": N, "signal": "xid79"|"ecc"|"lost"|...};
                                              answers "injected_ns" (CLOCK_MONOTONIC)
    POST   /v1/hosts/{id}/heal?gpu=N          undo (all GPUs without gpu)
    POST   /v1/hosts/{id}/kill                the host dies: no more heartbeats, its job's
                                              processes die; answers "injected_ns"
    POST   /v1/hosts/{id}/revive              a killed host is back, healthy, reporting again
    POST   /v1/hosts/{id}/nics/{nic}          {"up": false} takes a NIC's link down
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Protocol

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import HTTPConnection


class HostControl(Protocol):
    """An emulated GPU host, as the control endpoint drives it (the host itself is played
    by whoever registered it)."""

    def fail(self, gpu: int, signal: str) -> int:
        """Inject a GPU failure; returns when it happened (CLOCK_MONOTONIC ns)."""
        ...

    def heal(self, gpu: int | None) -> None: ...
    def nic_down(self, nic: str, down: bool) -> None: ...

    async def kill(self) -> int:
        """The host dies; returns when (CLOCK_MONOTONIC ns)."""
        ...

    def revive(self) -> None:
        """A killed host is back, healthy."""
        ...

    def describe(self) -> dict[str, Any]: ...


class ControlledLab(Protocol):
    """What the control endpoint drives: an emulated lab (emulators.lab.EmulatedLab), typed
    here so that the server does not depend on the lab that starts it."""

    @property
    def devices(self) -> Mapping[str, Any]: ...
    @property
    def hosts(self) -> Mapping[str, HostControl]: ...

    def describe(self, emulator_id: str) -> dict[str, Any]: ...
    def truth(self, emulator_id: str, since: int = 0, light_since: int = 0, *,
              light: bool = True) -> dict[str, Any]: ...
    def light(self, since: int = 0) -> list[dict[str, Any]]: ...
    def inject(self, emulator_id: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def clear_faults(self, emulator_id: str) -> None: ...
    def set_timing(self, emulator_id: str, values: dict[str, Any]) -> dict[str, Any]: ...
    async def power(self, emulator_id: str, on: bool) -> dict[str, Any]: ...
    def reset(self, emulator_id: str | None = None) -> None: ...
    def host(self, host_id: str) -> HostControl: ...


class FaultBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: str
    count: int | None = Field(default=None, ge=1)
    delay_ms: float = Field(default=0.0, ge=0)
    apply: bool = False
    port: int | None = None
    channel: int | None = Field(default=None, ge=1)
    now: bool = False


class PowerBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    on: bool


class GpuFaultBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpu: int = Field(ge=0)
    signal: str


class NicBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    up: bool


class TimingBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    switch_time_ms: float | None = Field(default=None, ge=0)
    jitter_ms: float | None = Field(default=None, ge=0)
    per_pair_ms: float | None = Field(default=None, ge=0)
    seed: int | None = None


router = APIRouter()


# async: a plain function would be run in a worker thread on every request
async def lab_of(connection: HTTPConnection) -> ControlledLab:
    """The lab ``create_app`` put on the app's state."""
    lab: ControlledLab = connection.app.state.lab
    return lab


LabDep = Annotated[ControlledLab, Depends(lab_of)]


@router.get("/v1/emulators")
async def list_emulators(lab: LabDep) -> list[dict[str, Any]]:
    return [lab.describe(i) for i in lab.devices]


@router.get("/v1/emulators/{emulator_id}")
async def get_emulator(emulator_id: str, lab: LabDep) -> dict[str, Any]:
    return lab.describe(emulator_id)


@router.get("/v1/emulators/{emulator_id}/truth")
async def truth(lab: LabDep, emulator_id: str, since: int = Query(0, ge=0),
                light_since: int = Query(0, ge=0), light: bool = True) -> dict[str, Any]:
    return lab.truth(emulator_id, since, light_since, light=light)


@router.get("/v1/light")
async def light(lab: LabDep, since: int = Query(0, ge=0)) -> list[dict[str, Any]]:
    return lab.light(since)


@router.post("/v1/emulators/{emulator_id}/faults")
async def inject(emulator_id: str, body: FaultBody, lab: LabDep) -> dict[str, Any]:
    data = body.model_dump(exclude_none=True)
    if body.count is None and "count" in body.model_fields_set:
        data["count"] = None
    return lab.inject(emulator_id, data)


@router.delete("/v1/emulators/{emulator_id}/faults")
async def clear(emulator_id: str, lab: LabDep) -> dict[str, Any]:
    lab.clear_faults(emulator_id)
    return lab.describe(emulator_id)


@router.put("/v1/emulators/{emulator_id}/timing")
async def timing(emulator_id: str, body: TimingBody, lab: LabDep) -> dict[str, Any]:
    return lab.set_timing(emulator_id, body.model_dump(exclude_none=True))


@router.put("/v1/emulators/{emulator_id}/power")
async def power(emulator_id: str, body: PowerBody, lab: LabDep) -> dict[str, Any]:
    return await lab.power(emulator_id, body.on)


@router.post("/v1/emulators/{emulator_id}/reset")
async def reset_one(emulator_id: str, lab: LabDep) -> dict[str, Any]:
    lab.reset(emulator_id)
    return lab.describe(emulator_id)


@router.get("/v1/hosts")
async def hosts(lab: LabDep) -> list[dict[str, Any]]:
    return [h.describe() for h in lab.hosts.values()]


@router.post("/v1/hosts/{host_id}/fail")
async def fail_gpu(host_id: str, body: GpuFaultBody, lab: LabDep) -> dict[str, Any]:
    host = lab.host(host_id)
    at_ns = host.fail(body.gpu, body.signal)
    return {**host.describe(), "injected_ns": at_ns}


@router.post("/v1/hosts/{host_id}/heal")
async def heal(lab: LabDep, host_id: str, gpu: int | None = None) -> dict[str, Any]:
    host = lab.host(host_id)
    host.heal(gpu)
    return host.describe()


@router.post("/v1/hosts/{host_id}/nics/{nic}")
async def nic(host_id: str, nic: str, body: NicBody, lab: LabDep) -> dict[str, Any]:
    host = lab.host(host_id)
    host.nic_down(nic, not body.up)
    return host.describe()


@router.post("/v1/hosts/{host_id}/kill")
async def kill(host_id: str, lab: LabDep) -> dict[str, Any]:
    host = lab.host(host_id)
    at_ns = await host.kill()
    return {**host.describe(), "injected_ns": at_ns}


@router.post("/v1/hosts/{host_id}/revive")
async def revive(host_id: str, lab: LabDep) -> dict[str, Any]:
    host = lab.host(host_id)
    host.revive()
    return host.describe()


@router.post("/v1/reset")
async def reset_all(lab: LabDep) -> dict[str, str]:
    lab.reset()
    return {"status": "reset"}


async def _unknown(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, KeyError)
    return JSONResponse({"detail": exc.args[0]}, status_code=404)


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(exc)}, status_code=422)


def create_app(lab: ControlledLab) -> FastAPI:
    """The control endpoint's app on ``lab`` (its routes find it on ``app.state.lab``)."""
    app = FastAPI(title="labd emulator control", version="1")
    app.add_exception_handler(KeyError, _unknown)
    app.add_exception_handler(ValueError, _invalid)
    app.include_router(router)
    app.state.lab = lab
    return app


class _Server(uvicorn.Server):
    """uvicorn without its signal handling: the process that embeds the lab owns signals."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    def install_signal_handlers(self) -> None:
        pass


class ControlServer:
    def __init__(self, lab: ControlledLab, host: str, port: int) -> None:
        self.app = create_app(lab)
        self.host, self.port = host, port
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> str:
        # IPPROTO_TCP named, or asyncio leaves Nagle on for accepted connections (a reply
        # written in two parts would then wait 40 ms for a delayed ACK).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        host, port = sock.getsockname()[:2]
        config = uvicorn.Config(self.app, log_level="warning", lifespan="off")
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]),
                                         name="emulator-control")
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.005)
        return f"http://{host}:{port}"

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(asyncio.CancelledError, Exception):
                async with asyncio.timeout(5):
                    await self._task
