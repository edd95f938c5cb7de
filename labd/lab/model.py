"""The lab as one model: its entries, checked against each other (hosts and jobs name real
endpoints, fibres join real ports, ids are unique, light windows fit the emulators).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from instruments.switch import parse_size
from labd.lab.entries import (
    METER_ENTRIES,
    SWITCH_ENTRIES,
    EndpointEntry,
    FiberEntry,
    HostEntry,
    Instrument,
    JobEntry,
    LabSection,
    Strict,
    SwitchEntry,
)
from labd.lab.limits import MAX_PORT


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
