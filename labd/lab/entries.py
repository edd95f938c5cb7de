"""The entries of a lab file, one pydantic model each: instruments, endpoints, fibres,
hosts and jobs (docs/lab-file.md for every field).
"""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from instruments.address import parse_address
from instruments.errors import AddressError
from instruments.switch import parse_size
from labd.lab.options import option_problems

LOOPBACK = {"127.0.0.1", "localhost", "::1"}


#: Light verification logs at most this long (a meter logs window / resolution points).
LIGHT_WINDOW_MAX_MS = 10_000.0


class Strict(BaseModel):
    # No infinities or NaNs: every number in a lab file is a bound, a time or a power. And
    # no coercion: "yes" is no boolean, "0.5" no loss, 1 no flag (a whole number still
    # counts where a fraction may be given: 1 for 1.0).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=True)


class EmulatorSettings(Strict):
    """``[instrument.emulator]``: how ``labd emulate`` plays this instrument."""

    technology: Literal["beam-steering", "mems-3d", "thermo-optic", "ideal"] | None = None
    switch_time_ms: float | None = Field(default=None, ge=0)
    jitter_ms: float | None = Field(default=None, ge=0)
    per_pair_ms: float | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    profile: Literal["mixnet-polatis-tl1"] | None = None
    """A switch's time as a publication measured it (docs/emulators.md, "Timing profiles");
    ``switch_time_ms``/``per_pair_ms`` given beside it replace it, ``jitter_ms`` adds."""
    serve: Literal["tcp", "pty", "hislip", "vxi11"] | None = None
    """Where the emulator listens: a TCP port, a pty (a serial line), or HiSLIP or VXI-11
    (an SCPI instrument as VISA's ``TCPIP::…::INSTR``, reached by the daemon through
    pyvisa; VXI-11's portmapper takes port 111 on 127.0.0.2, which needs root).
    Default: pty for serial devices (the mesh's driver board), TCP otherwise."""
    options: dict[str, Any] = Field(default_factory=dict, max_length=64)
    """Device options of the emulator (the protocols' [?] items): see docs/emulators.md."""

    def timing(self) -> dict[str, Any]:
        values = {"technology": self.technology, "switch_time_ms": self.switch_time_ms,
                  "jitter_ms": self.jitter_ms, "per_pair_ms": self.per_pair_ms,
                  "seed": self.seed, "profile": self.profile}
        return {k: v for k, v in values.items() if v is not None}


class InstrumentBase(Strict):
    id: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", max_length=64)]
    driver: str
    address: str | None = None
    emulate: bool = False
    description: str = ""
    timeout: float | None = Field(default=None, gt=0, le=600)
    """Seconds to wait for a reply; the driver's default when absent."""
    write_termination: str | None = None
    read_termination: str | None = None
    query_delay: float = Field(default=0.0, ge=0, le=10)
    watch_interval_s: float = Field(default=2.0, ge=0, le=3600)
    """Seconds idle before the daemon sends the instrument one cheap query to see that it
    is still there (and the same device); 0 turns the watch off."""
    emulator: EmulatorSettings = Field(default_factory=EmulatorSettings)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                parse_address(value)
            except AddressError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("emulator")
    @classmethod
    def _options(cls, value: EmulatorSettings, info: ValidationInfo) -> EmulatorSettings:
        problems = option_problems(str(info.data.get("driver")), value.options)
        if problems:
            raise ValueError("; ".join(problems))
        return value

    @model_validator(mode="after")
    def _where(self) -> InstrumentBase:
        if self.address is None and not self.emulate:
            raise ValueError("'address' is required unless emulate = true")
        if self.emulate and self.address is not None:
            scheme = self.address.split("://", 1)[0]
            if scheme == "tcp":
                host = urlsplit(self.address).hostname or ""
                if host not in LOOPBACK:
                    raise ValueError(
                        f"an emulated instrument listens on this machine: use "
                        f"tcp://127.0.0.1:PORT (or leave 'address' out), not {self.address!r}")
            elif scheme != "serial":
                raise ValueError("an emulated instrument is served on tcp:// or a pty; "
                                 "leave 'address' out or use tcp://127.0.0.1:PORT")
        return self


class SwitchEntry(InstrumentBase):
    size: str | None = None
    """``NxM`` for Polatis (e.g. ``16x16``), a port count for CALIENT (e.g. ``320``)."""
    light_window_ms: float | None = Field(default=None, gt=0, le=LIGHT_WINDOW_MAX_MS)
    """How long light verification waits after a change on this switch; default the lab's."""
    audit_interval_s: float = Field(default=0.0, ge=0, le=86_400)
    """Seconds between map audits while the switch is idle (one map read, in place of the
    liveness probe), so that circuits another controller changed are found and dealt with
    as ``on_drift`` says; 0 (the default): no audit."""
    on_drift: Literal["restore", "report", "adopt"] = "restore"
    """When the switch is found holding other circuits than intended (at start-up, after a
    reconnect or a restart): put the intended ones back, only report it, or take the
    switch's map as the intended one."""

    @field_validator("size")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None:
            parse_size(value)
        return value


class NxMSwitch(SwitchEntry):
    @field_validator("size")
    @classmethod
    def _nxm(cls, value: str | None) -> str | None:
        if value is not None and parse_size(value)[1] == 0:
            raise ValueError(f"size {value!r}: this switch is NxM, e.g. '16x16'")
        return value


class PolatisScpiEntry(NxMSwitch):
    driver: Literal["polatis-scpi"]


class Tl1Credentials(SwitchEntry):
    user: str
    password: str | None = None
    password_env: str | None = None
    """Name of an environment variable holding the password (keeps secrets out of files)."""
    tid: str = ""

    @model_validator(mode="after")
    def _password(self) -> Tl1Credentials:
        if (self.password is None) == (self.password_env is None):
            raise ValueError("give exactly one of 'password' or 'password_env'")
        return self

    def resolved_password(self) -> str:
        """The password, from the file or from the environment; ValueError names what is
        missing."""
        if self.password is not None:
            return self.password
        assert self.password_env is not None
        value = os.environ.get(self.password_env)
        if value is None:
            raise ValueError(f"field 'password_env': environment variable "
                             f"{self.password_env} is not set; export it, or give 'password'")
        return value


class PolatisTl1Entry(Tl1Credentials, NxMSwitch):
    driver: Literal["polatis-tl1"]


class CalientTl1Entry(Tl1Credentials):
    driver: Literal["calient-tl1"]

    @field_validator("size")
    @classmethod
    def _count(cls, value: str | None) -> str | None:
        if value is not None and parse_size(value)[1] != 0:
            raise ValueError(f"size {value!r}: a CALIENT switch has N ports, e.g. '320'")
        return value
    ports_per_slot: int = Field(default=32, ge=1, le=128)
    group: str = "SYSTEM"
    aid_lists: bool = True
    """Send ``&`` lists of ports in one command; false sends one pair per command."""


#: The most channels a Qontrol-style board chain drives (instruments.qontrol).
BOARD_CHANNELS = 2048


class ChannelLimit(Strict):
    """``[[instrument.channel]]``: one DAC channel's limits, over the board's."""

    channel: int = Field(ge=0, lt=BOARD_CHANNELS)
    """The board's channel, from 0 (heater k of a mesh is channel k)."""
    vmax: float | None = Field(default=None, gt=0, le=60)
    """Most volts this channel is driven to."""
    imax: float | None = Field(default=None, gt=0, le=300)
    """Most milliamperes this channel drives."""

    @model_validator(mode="after")
    def _some(self) -> ChannelLimit:
        if self.vmax is None and self.imax is None:
            raise ValueError(f"channel {self.channel}: give 'vmax', 'imax' or both")
        return self


class MeshEntry(NxMSwitch):
    """A Beneš MZI mesh whose heaters hang off a Qontrol-style board (the address)."""

    driver: Literal["qontrol-mesh"]
    size: str
    v_pi: float = Field(default=5.0, gt=0, le=12)
    """Heater voltage for a π phase shift, for every heater (nominal calibration)."""
    calibration: dict[str, list[float]] | None = None
    """Per-heater ``alpha`` (rad/V²) and ``phi0`` (rad), from your calibration run."""
    settle_us: float = Field(default=50.0, ge=0, le=1e6)
    """Thermal settling waited after each change."""
    vmax: float | None = Field(default=None, gt=0, le=60)
    """Most volts any channel of the board is driven to (programmed as its VMAX)."""
    imax: float | None = Field(default=None, gt=0, le=300)
    """Most milliamperes any channel drives (programmed as its IMAX)."""
    channel: list[ChannelLimit] = Field(default_factory=list, max_length=BOARD_CHANNELS)
    """Per-channel limits, over ``vmax``/``imax``."""

    @field_validator("channel")
    @classmethod
    def _once(cls, value: list[ChannelLimit]) -> list[ChannelLimit]:
        seen: set[int] = set()
        for limit in value:
            if limit.channel in seen:
                raise ValueError(f"channel {limit.channel} is given twice")
            seen.add(limit.channel)
        return value

    def limit_options(self) -> dict[str, Any]:
        """The limits as the driver takes them (``vmax``, ``imax``, ``channel_limits``)."""
        per = {c.channel: {"vmax": c.vmax, "imax": c.imax} for c in self.channel}
        return {"vmax": self.vmax, "imax": self.imax, "channel_limits": per}

    @model_validator(mode="after")
    def _reachable(self) -> MeshEntry:
        # The calibration must fit the limits: a heater that cannot reach both states
        # within its vmax leaves routes that can never be made (the driver refuses them
        # too, but a lab file that cannot work is better refused by labd check).
        from instruments.errors import InvalidRequest
        from instruments.mesh import MeshSwitch

        try:
            MeshSwitch("serial:///dev/null", size=self.size, v_pi=self.v_pi,
                       calibration=self.calibration, **self.limit_options())
        except InvalidRequest as exc:
            raise ValueError(exc.args[0]) from None
        return self

    @field_validator("size")
    @classmethod
    def _power_of_two(cls, value: str) -> str:
        n, m = parse_size(value)
        if n != m or n < 2 or n & (n - 1) or n > 64:
            raise ValueError(f"size {value!r}: a Beneš mesh is NxN with N a power of two, "
                             "2..64")
        return value


class KeysightEntry(InstrumentBase):
    driver: Literal["keysight-n77xx"]
    channels: Literal[4, 8] | None = None
    """4 (N7744A) or 8 (N7745A); read from the model when absent."""

    def channel_count(self) -> int:
        model = str(self.emulator.options.get("model", ""))
        return self.channels or (8 if "7745" in model else 4)


class ThorlabsEntry(InstrumentBase):
    driver: Literal["thorlabs-pm100"]

    def channel_count(self) -> int:
        return 1


Instrument = Annotated[
    PolatisScpiEntry | PolatisTl1Entry | CalientTl1Entry | MeshEntry | KeysightEntry
    | ThorlabsEntry,
    Field(discriminator="driver"),
]
SWITCH_ENTRIES = (PolatisScpiEntry, PolatisTl1Entry, CalientTl1Entry, MeshEntry)
METER_ENTRIES = (KeysightEntry, ThorlabsEntry)
DRIVERS = ("polatis-scpi", "polatis-tl1", "calient-tl1", "qontrol-mesh", "keysight-n77xx",
           "thorlabs-pm100")


class LabSection(Strict):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", max_length=64)]
    description: str = ""
    light_threshold_dbm: float = Field(default=-30.0, ge=-80, le=20)
    """Power above which light counts as present (verification, ground truth)."""
    light_window_ms: float = Field(default=100.0, gt=0, le=LIGHT_WINDOW_MAX_MS)
    """How long light verification waits for light to arrive or leave after a change: more
    than the slowest switch takes."""


NODE = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}(:[0-9]{1,6})?$"


class EndpointEntry(Strict):
    """``[[endpoint]]``: a GPU/NIC port or any place light starts or ends."""

    id: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", max_length=64)]
    launch_dbm: float | None = Field(default=None, ge=-40, le=20)
    """Transmit power; leave out for an endpoint that only receives."""
    wavelength_nm: float = Field(default=1310.0, ge=800, le=1700)


class FiberEntry(Strict):
    """``[[fiber]]``: one-way, ``from`` → ``to``; a node is an endpoint id, ``switch:port``
    or ``meter:channel``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    src: Annotated[str, Field(alias="from", pattern=NODE)]
    dst: Annotated[str, Field(alias="to", pattern=NODE)]
    loss_db: float = Field(default=0.0, ge=0, le=60)
    tap: Annotated[str | None, Field(pattern=NODE)] = None
    """A meter channel fed by a tap on this fibre."""
    tap_ratio: float = Field(default=0.01, gt=0, lt=1)


class HostEntry(Strict):
    """``[[host]]``: a GPU host and the endpoints (NIC ports) it owns."""

    id: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", max_length=64)]
    nics: list[str] = Field(default_factory=list)
    """Endpoint ids of this host's NIC ports; the n-th NIC is the one GPU n uses (a job
    rank on that endpoint runs on that GPU)."""
    gpus: int = Field(default=8, ge=0, le=64)
    rack: str = ""
    emulate: bool = False
    """``labd emulate --mqtt URL`` plays this host: an agent with emulated GPUs."""
    heartbeat_s: float = Field(default=1.0, gt=0, le=60)
    """The agent's heartbeat interval."""
    link_up_ms: Annotated[float, Field(ge=0, le=60_000)] | Literal["mixnet"] = 0.0
    """Emulation: how long light must arrive before a NIC's link comes up; ``"mixnet"``
    draws it from MixNet's measurement (5.67 s mean, p99 6.33 s: docs/emulators.md)."""


def topology_links(topology: str, members: list[str]) -> list[tuple[str, str]]:
    """(sender, receiver) for every circuit a topology over ``members`` needs."""
    m = members
    if topology == "ring":
        return [(m[i], m[(i + 1) % len(m)]) for i in range(len(m))]
    return [link for i in range(0, len(m), 2) for link in ((m[i], m[i + 1]), (m[i + 1], m[i]))]


class JobEmulator(Strict):
    """``[job.emulator]``: the emulated training process emulated hosts run for this job."""

    init_ms: float = Field(default=200.0, ge=0, le=600_000)
    """From start to "collectives ready" (the NCCL communicator set-up)."""
    step_ms: float = Field(default=100.0, gt=0, le=600_000)
    """One training step."""


class JobEntry(Strict):
    """``[[job]]``: a logical topology over endpoints, made of circuits."""

    id: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_.-]*$", max_length=64)]
    topology: Literal["ring", "pairs"]
    """``ring``: each member sends to the next (and the last to the first); ``pairs``:
    members 1-2, 3-4, ... send to each other."""
    members: list[str] = Field(min_length=2)
    """Endpoint ids, in rank order."""
    spares: list[str] = Field(default_factory=list)
    """Endpoint ids (NICs of [[host]]s) that may stand in for a failed member."""
    recovery: Literal["automatic", "ask", "off"] = "automatic"
    """On a failure: swap in a spare at once, propose the swap and wait for the operator,
    or only record the failure."""
    link_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    """How long recovery waits for the new circuits' NIC links to come up."""
    start_timeout_s: float = Field(default=120.0, gt=0, le=3600)
    """How long recovery waits for the restarted job's first step."""
    emulator: JobEmulator = Field(default_factory=JobEmulator)

    @model_validator(mode="after")
    def _shape(self) -> JobEntry:
        if self.topology == "pairs" and len(self.members) % 2:
            raise ValueError(f"job {self.id!r}: 'pairs' needs an even number of members")
        if len(set(self.members)) != len(self.members):
            raise ValueError(f"job {self.id!r}: a member appears twice")
        both = sorted(set(self.members) & set(self.spares))
        if both:
            raise ValueError(f"job {self.id!r}: {', '.join(both)} is both a member and a spare")
        if len(set(self.spares)) != len(self.spares):
            raise ValueError(f"job {self.id!r}: a spare appears twice")
        return self

    def links(self, members: list[str] | None = None) -> list[tuple[str, str]]:
        """(sender, receiver) for every circuit the topology needs (over ``members``, by
        default the configured ones)."""
        return topology_links(self.topology, self.members if members is None else members)
