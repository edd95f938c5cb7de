"""The lab file: one TOML file describes a lab (see docs/lab-file.md for every field).

``load_lab(path_or_name)`` returns a validated :class:`Lab` or raises :class:`LabFileError`
whose lines each name the file, the entry and the field, and say what is expected.
A bare name (``demo``) refers to a lab packaged with labd.
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from instruments.address import parse_address
from instruments.errors import AddressError
from instruments.switch import parse_size
from labd.errors import LabFileError
from labd.files import TomlError, loads_toml
from labd.lab.limits import MAX_DEPTH, MAX_FILE_BYTES, MAX_PORT, deepest
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
    serve: Literal["tcp", "pty"] | None = None
    """Where the emulator listens: a TCP port or a pty (a serial line). Default: pty for
    serial devices (the mesh's driver board), TCP otherwise."""
    options: dict[str, Any] = Field(default_factory=dict, max_length=64)
    """Device options of the emulator (the protocols' [?] items): see docs/emulators.md."""

    def timing(self) -> dict[str, Any]:
        values = {"technology": self.technology, "switch_time_ms": self.switch_time_ms,
                  "jitter_ms": self.jitter_ms, "per_pair_ms": self.per_pair_ms,
                  "seed": self.seed}
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
    link_up_ms: float = Field(default=0.0, ge=0, le=60_000)
    """Emulation: how long light must arrive before a NIC's link comes up."""


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


class Lab(Strict):
    lab: LabSection
    instrument: list[Instrument] = Field(default_factory=list)
    endpoint: list[EndpointEntry] = Field(default_factory=list)
    fiber: list[FiberEntry] = Field(default_factory=list)
    host: list[HostEntry] = Field(default_factory=list)
    job: list[JobEntry] = Field(default_factory=list)
    daemon: dict[str, Any] = Field(default_factory=dict, exclude=True)
    """The ``[daemon]`` table: settings of ``labd run`` (labd.settings), under those of its
    ``--config`` file. Excluded from dumps: it may hold a broker's or database's URL with
    its password."""
    source: str = Field(default="", exclude=True)

    @field_validator("daemon")
    @classmethod
    def _daemon_settings(cls, table: dict[str, Any]) -> dict[str, Any]:
        # Checked here too, so that a misspelt setting is found by loading the lab (labd
        # check, the TUI's editor), not only when labd run starts.
        from labd.settings import check_table

        problems = check_table(table)
        if problems:
            raise ValueError("; ".join(problems))
        return table

    @model_validator(mode="after")
    def _hosts_and_jobs(self) -> Lab:
        endpoints = {e.id for e in self.endpoint}
        problems = []
        for index, host in enumerate(self.host):
            for nic in host.nics:
                if nic not in endpoints:
                    problems.append(f"[[host]] #{index + 1} (id {host.id!r}), field 'nics': "
                                    f"{nic!r} names no [[endpoint]]")
        owners: dict[str, str] = {}
        for host in self.host:
            for nic in host.nics:
                if nic in owners:
                    problems.append(f"[[host]] {host.id!r}, field 'nics': {nic!r} is already "
                                    f"a NIC of host {owners[nic]!r}")
                owners.setdefault(nic, host.id)
        on_hosts = set(owners)
        for index, job in enumerate(self.job):
            for member in job.members:
                if member not in endpoints:
                    problems.append(f"[[job]] #{index + 1} (id {job.id!r}), field 'members': "
                                    f"{member!r} names no [[endpoint]]")
            for spare in job.spares:
                if spare not in on_hosts:
                    problems.append(f"[[job]] #{index + 1} (id {job.id!r}), field 'spares': "
                                    f"{spare!r} is no NIC of a [[host]] (list it in a "
                                    "host's 'nics')")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def light_window_ms(self, switch: str) -> float:
        """How long light verification waits after a change on ``switch``."""
        entry = next((i for i in self.instrument if i.id == switch), None)
        own = entry.light_window_ms if isinstance(entry, SwitchEntry) else None
        return own if own is not None else self.lab.light_window_ms

    @model_validator(mode="after")
    def _light_window(self) -> Lab:
        # An emulated switch slower than the window would fail every light verification.
        problems = []
        for index, entry in enumerate(self.instrument):
            if not (isinstance(entry, SwitchEntry) and entry.emulate):
                continue
            timing = entry.emulator
            slowest = (timing.switch_time_ms or 0.0) + (timing.jitter_ms or 0.0)
            window = self.light_window_ms(entry.id)
            if slowest >= window:
                problems.append(
                    f"[[instrument]] #{index + 1} (id {entry.id!r}): its emulator switches "
                    f"in up to {slowest:g} ms, not within the light window of {window:g} ms; "
                    "set 'light_window_ms' (on the switch or in [lab]) above it")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _unique(self) -> Lab:
        ids = [i.id for i in self.instrument] + [e.id for e in self.endpoint]
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise ValueError(f"instrument and endpoint ids must be unique; repeated: "
                             f"{', '.join(repeated)}")
        return self

    @model_validator(mode="after")
    def _wiring(self) -> Lab:
        problems = []
        problems.extend(self._fibre_shape())
        for index, fiber in enumerate(self.fiber):
            for field, node, allowed in (("from", fiber.src, ("endpoint", "switch")),
                                         ("to", fiber.dst, ("endpoint", "switch", "meter")),
                                         ("tap", fiber.tap, ("meter",))):
                if node is None:
                    continue
                problem = self._check_node(node, allowed)
                if problem:
                    problems.append(f"[[fiber]] #{index + 1}, field '{field}': {problem}")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def _fibre_shape(self) -> list[str]:
        """Fibres light could not take: a port to itself, two fibres into (or out of) one
        port or channel, fibres in a circle through switch ports."""
        problems = []
        switches = {e.id for e in self.instrument if isinstance(e, SWITCH_ENTRIES)}

        def port(node: str | None) -> bool:
            return node is not None and node.partition(":")[0] in switches and ":" in node

        into: dict[str, int] = {}
        out_of: dict[str, int] = {}
        for index, fiber in enumerate(self.fiber, start=1):
            if fiber.src == fiber.dst:
                problems.append(f"[[fiber]] #{index}: from {fiber.src!r} to itself; a fibre "
                                "joins two different places")
                continue
            for node in (fiber.dst, fiber.tap):
                if node is None or ":" not in node:
                    continue  # an endpoint may receive on several fibres (a duplex NIC)
                if node in into:
                    problems.append(f"[[fiber]] #{index}: {node!r} already receives "
                                    f"[[fiber]] #{into[node]}; one fibre into a port or "
                                    "channel")
                into.setdefault(node, index)
            if port(fiber.src):
                if fiber.src in out_of:
                    problems.append(f"[[fiber]] #{index}: {fiber.src!r} already sends into "
                                    f"[[fiber]] #{out_of[fiber.src]}; one fibre out of a port")
                out_of.setdefault(fiber.src, index)
        problems.extend(self._circles(port))
        return problems

    def _circles(self, port: Any) -> list[str]:
        """Fibres that go from switch port to switch port and come back round: light in
        them would never reach an endpoint."""
        onward = {f.src: (i, f.dst) for i, f in enumerate(self.fiber, start=1)
                  if port(f.src) and port(f.dst) and f.src != f.dst}
        problems, settled = [], set()
        for start in onward:
            trail: list[str] = []
            on_trail: set[str] = set()  # the list keeps the order; this, a quick lookup
            node: str | None = start
            while node in onward and node not in settled and node not in on_trail:
                trail.append(node)
                on_trail.add(node)
                node = onward[node][1]
            if node in on_trail:
                circle = trail[trail.index(node):]
                numbers = ", ".join(f"#{onward[n][0]}" for n in circle)
                path = " -> ".join([*circle, circle[0]])
                problems.append(f"[[fiber]] {numbers} make a circle ({path}): light in it "
                                "would never reach an endpoint")
            settled.update(trail)
        return problems

    def _check_node(self, node: str, allowed: tuple[str, ...]) -> str | None:
        owner, _, number = node.partition(":")
        if not number:
            if owner in {e.id for e in self.endpoint}:
                return None if "endpoint" in allowed else f"{node!r} is an endpoint; " \
                    f"expected a {' or '.join(allowed)}"
            return f"{node!r} names no [[endpoint]]; a port is written 'switch:port'"
        entries = {e.id: e for e in self.instrument}
        entry = entries.get(owner)
        if entry is None:
            return f"{node!r}: no instrument {owner!r}"
        n = int(number)
        if not 1 <= n <= MAX_PORT:
            return (f"{node!r}: ports and channels are numbered from 1 (to at most "
                    f"{MAX_PORT})")
        if isinstance(entry, SWITCH_ENTRIES):
            if "switch" not in allowed:
                return f"{node!r} is a switch port; expected a {' or '.join(allowed)}"
            if entry.size:
                ports = sum(parse_size(entry.size))
                if not 1 <= n <= ports:
                    return f"{node!r}: {owner} has ports 1..{ports}"
            return None
        if isinstance(entry, METER_ENTRIES):
            if "meter" not in allowed:
                return f"{node!r} is a meter channel; expected a {' or '.join(allowed)}"
            if not 1 <= n <= entry.channel_count():
                return f"{node!r}: {owner} has channels 1..{entry.channel_count()}"
            return None
        return f"{node!r}: {owner} carries no light"

    def placement(self, endpoint: str) -> tuple[HostEntry, int] | None:
        """The host whose NIC ``endpoint`` is, and the GPU behind it."""
        for host in self.host:
            if endpoint in host.nics:
                return host, host.nics.index(endpoint)
        return None

    def get(self, instrument_id: str) -> Instrument:
        for entry in self.instrument:
            if entry.id == instrument_id:
                return entry
        raise KeyError(instrument_id)


def packaged_labs() -> dict[str, Path]:
    folder = resources.files("labd") / "labs"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir()
            if str(p).endswith(".toml")}


def resolve_lab_path(name_or_path: str | os.PathLike[str]) -> Path:
    text = str(name_or_path)
    path = Path(text)
    shown = text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"
    try:
        if path.exists():
            return path
    except (OSError, ValueError) as exc:  # a name too long for the system, a NUL in it
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise LabFileError(shown, [f"{shown}: cannot be a lab file's name: {reason}"]) from None
    labs = packaged_labs()
    if text in labs:
        return labs[text]
    raise LabFileError(shown, [
        f"{shown}: no such file, and no packaged lab of that name "
        f"(packaged: {', '.join(sorted(labs))})"
    ])


def _where(data: dict[str, Any], loc: tuple[int | str, ...]) -> tuple[str, tuple[int | str, ...]]:
    """Turn a pydantic location into 'instrument #2 (id "ocs1")' and the rest of the path."""
    if len(loc) >= 2 and loc[0] == "instrument" and isinstance(loc[1], int):
        index = loc[1]
        rest = loc[2:]
        if rest and isinstance(rest[0], str) and rest[0] in DRIVERS:
            rest = rest[1:]  # the discriminator's tag, not a field
        entries = data.get("instrument")
        entry = entries[index] if isinstance(entries, list) and index < len(entries) else None
        ident = entry.get("id") if isinstance(entry, dict) else None
        shown = f" (id {ident!r})" if isinstance(ident, str) and ident and len(ident) <= 64 \
            else ""
        label = f"[[instrument]] #{index + 1}{shown}"
        return label, rest
    if len(loc) >= 2 and loc[0] in ("endpoint", "fiber", "host", "job") and isinstance(
            loc[1], int):
        return f"[[{loc[0]}]] #{loc[1] + 1}", loc[2:]
    if loc and loc[0] in ("lab", "daemon"):
        return f"[{loc[0]}]", loc[1:]
    return "", loc


def _explain(err: Any) -> str:
    kind = err["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field (check the spelling; see docs/lab-file.md)"
    if kind == "union_tag_invalid":
        return (f"unknown driver {err['ctx']['tag']!r}; expected one of "
                f"{err['ctx']['expected_tags']}")
    if kind == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") == NODE:
        return (f"{_shown(err['input'])} is not an endpoint id, 'switch:port' or "
                f"'meter:channel' (a number of at most six digits)")
    if kind == "string_pattern_mismatch":
        return (f"{_shown(err['input'])} must start with a letter or digit and hold only letters, "
                "digits, '_', '.' and '-'")
    if kind == "union_tag_not_found":
        return "needs a 'driver' field"
    message = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return f"{message} (got {_shown(err['input'])})" if "input" in err and not isinstance(
        err["input"], dict | list) else message


def _shown(value: Any, limit: int = 60) -> str:
    """A value in a message: its repr, cut short (a message names a value, not all of it)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def file_sha256(source: str) -> str:
    """The SHA-256 of a lab file (measurement runs name the lab they ran on by it); empty
    for a lab that has no file."""
    try:
        return hashlib.sha256(Path(source).read_bytes()).hexdigest()
    except OSError:
        return ""


def parse_lab(data: dict[str, Any], source: str) -> Lab:
    try:
        return Lab.model_validate({**data, "source": source})
    except RecursionError:
        raise LabFileError(source, [f"{source}: nests too deeply to check (at most "
                                    f"{MAX_DEPTH} levels of tables and arrays)"]) from None
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            label, rest = _where(data, tuple(err["loc"]))
            field = ".".join(str(p) for p in rest)
            if not label and not field:  # a whole-file check: its message names the entry
                problems.append(f"{source}: {_explain(err)}")
                continue
            where = label or "top level"
            problems.append(f"{source}: {where}" + (f", field '{field}'" if field else "")
                            + f": {_explain(err)}")
        raise LabFileError(source, problems) from None


def load_lab(name_or_path: str | os.PathLike[str]) -> Lab:
    path = resolve_lab_path(name_or_path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise LabFileError(str(path), [f"{path}: cannot read: {exc}"]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise LabFileError(str(path), [f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; "
                                       "a lab file is a few hundred KB at most"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LabFileError(str(path), [f"{path}: cannot read: not UTF-8 text ({exc.reason} "
                                       f"at byte {exc.start})"]) from None
    return parse_text(text, str(path))


def parse_text(text: str, source: str) -> Lab:
    """A lab file's text: TOML, bounded (nesting, numbers), then checked field by field."""
    try:
        data = loads_toml(text)
    except TomlError as exc:
        raise LabFileError(source, [f"{source}: {exc}"]) from None
    if deepest(data) > MAX_DEPTH:
        raise LabFileError(source, [f"{source}: tables or arrays nest too deeply (at most "
                                    f"{MAX_DEPTH} levels)"])
    return parse_lab(data, source)
