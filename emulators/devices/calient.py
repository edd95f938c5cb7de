"""A CALIENT S-Series switch over TL1 (port 3082): two-phase cross-connects (docs/protocols.md §2).

Options for the [?] items: ``prompt`` (a prompt such as ``agent> `` printed after each
response), ``login_settle_ms`` (commands sooner than this after ACT-USER are refused with
"Login Not Active"), ``ports_per_slot`` (port n is ``1.<slot>.<index>``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from emulators.physics.crossconnect import ModelError, SwitchModel
from emulators.physics.timing import TimingModel
from emulators.wire.faults import Faults
from emulators.wire.numbers import wire_int
from emulators.wire.server import Interface, SessionInterface
from emulators.wire.tl1 import Deny, Tl1Command, Tl1Session, quoted


@dataclass
class CalientOptions:
    ports: int = 320
    ports_per_slot: int = 32
    serial: str = "CAL-S320-0042"
    software: str = "7.3.1"
    chassis: str = "S320"
    sid: str = "CALIENT"
    users: dict[str, str] = field(default_factory=lambda: {"admin": "pxc***"})
    prompt: str = ""
    login_settle_ms: float = 0.0


@dataclass
class Crs:
    src: int
    dst: int
    group: str
    name: str
    kind: str = "2WAY"
    active: bool = False


class CalientSwitch:
    kind = "calient"

    def __init__(self, name: str, options: CalientOptions, timing: TimingModel) -> None:
        if not 2 <= options.ports <= 1024:
            raise ValueError(f"CALIENT ports {options.ports}: expected 2..1024")
        self.name = name
        self.options = options
        self.model = SwitchModel(name, options.ports, 0, timing=timing)
        self._port_fields = "keyword"
        self.faults = Faults()
        self.crs: dict[str, Crs] = {}
        # Port → connection: a command names each of its ports, and a scan of every
        # connection per port made a batch's exchange grow with the square of its size.
        self._by_port: dict[int, Crs] = {}
        self._ports: dict[str, int] = {}  # AID → port, for the AIDs that were valid
        self.tl1 = SessionInterface("tl1", b";", lambda: CalientTl1Session(self))

    def interfaces(self) -> dict[str, Interface]:
        return {"tl1": self.tl1}

    def reset(self) -> None:
        self.model.reset()
        self.crs.clear()
        self._by_port.clear()
        self.faults.clear()

    def boot(self) -> None:
        """Power comes back: the connection database and the mirrors' positions persist."""
        self.faults.clear()

    @property
    def port_fields(self) -> str:
        """``RTRV-PORT`` rows: ``keyword`` (``1.1.1:TYPE=OPTICAL,AS=IS,OS=IS,ALIAS=``, labd's
        form, which its driver reads) or ``positional`` (``1.1.1:WX,NONE,NONE:INAS=IS,…``,
        the form a real S162 answered in Quali's driver tests, which Quali's parser
        needs). Set on the running device; the lab file does not name it yet."""
        return self._port_fields

    @port_fields.setter
    def port_fields(self, form: str) -> None:
        if form not in ("keyword", "positional"):
            raise ValueError(f"CALIENT port_fields {form!r}: expected 'keyword' or "
                             "'positional'")
        self._port_fields = form

    def aid(self, port: int) -> str:
        slot, index = divmod(port - 1, self.options.ports_per_slot)
        return f"1.{slot + 1}.{index + 1}"

    def port(self, aid: str) -> int:
        port = self._ports.get(aid)
        if port is None:
            if len(self._ports) > 4 * self.options.ports:  # spellings of one port: " 1.1.1"
                self._ports.clear()
            port = self._ports[aid] = self._parse_port(aid)
        return port

    def _parse_port(self, aid: str) -> int:
        try:
            shelf, slot, index = (wire_int(x) for x in aid.strip().split("."))
        except ValueError:
            raise Deny("IIAC", f"Invalid AID {quoted(aid)}: expected shelf.slot.port") from None
        port = (slot - 1) * self.options.ports_per_slot + index
        if shelf != 1 or not 1 <= index <= self.options.ports_per_slot or not (
                1 <= port <= self.options.ports):
            raise Deny("IIAC", f"Invalid AID {aid}: no such port")
        return port

    def using(self, port: int) -> Crs | None:
        return self._by_port.get(port)

    def add_crs(self, crs: Crs) -> None:
        self.crs[crs.name] = crs
        self._by_port[crs.src] = self._by_port[crs.dst] = crs

    def drop_crs(self, crs: Crs) -> None:
        self.crs.pop(crs.name, None)
        for port in (crs.src, crs.dst):
            if self._by_port.get(port) is crs:
                del self._by_port[port]

    def snapshot(self) -> dict[str, Any]:
        data = self.model.snapshot()
        data["provisioned"] = [[c.src, c.dst, c.name] for c in self.crs.values() if not c.active]
        return data




class CalientTl1Session(Tl1Session):
    allow_empty_ctag = True

    def __init__(self, device: CalientSwitch) -> None:
        super().__init__(sid=device.options.sid, users=device.options.users)
        self.device = device
        self.model = device.model
        self.login_ns = 0
        self.verbs.update({
            "RTRV-NE": self._rtrv_ne,
            "RTRV-PORT": self._rtrv_port,
            "RTRV-PORT-SUM": self._rtrv_port_sum,
            "ENT-CRS": self._ent_crs,
            "ACT-CRS": self._act_crs,
            "CANC-CRS": self._canc_crs,
            "DLT-CRS": self._dlt_crs,
            "DLT-CRS-ALL": self._dlt_all,
            "RTRV-CRS": self._rtrv_crs,
            "INH-MSG": self._nothing,
            "ALW-MSG": self._nothing,
        })

    def closed(self) -> None:
        pass

    def logged_in(self) -> None:
        self.login_ns = time.monotonic_ns()

    def reply(self, ctag: str, lines: list[str] | None = None, *,
              deny: Deny | None = None) -> bytes:
        block = super().reply(ctag, lines, deny=deny)
        prompt = self.device.options.prompt
        return block + (f"\r\n{prompt}".encode() if prompt else b"")

    async def dispatch(self, command: Tl1Command, arrived_ns: int) -> bytes:
        settle = self.device.options.login_settle_ms * 1e6
        if (self.user is not None and command.verb not in self.public_verbs
                and arrived_ns - self.login_ns < settle):
            return self.reply(command.ctag, deny=Deny("SROF", "Login Not Active"))
        return await super().dispatch(command, arrived_ns)

    # -- helpers ---------------------------------------------------------------------------
    def _pairs(self, aid: str) -> list[tuple[int, int]]:
        src, sep, dst = aid.partition(",")
        if not sep:
            raise Deny("IPMS", "Expected <src>,<dst>")
        a = [self.device.port(x) for x in src.split("&")]
        b = [self.device.port(x) for x in dst.split("&")]
        if len(a) != len(b):
            raise Deny("IIAC", "Source and destination lists differ in length")
        return list(zip(a, b, strict=True))

    def _targets(self, c: Tl1Command) -> list[Crs]:
        """The connections a command names: by AIDs, or by connection name in the params."""
        if c.aid:
            found = []
            for a, b in self._pairs(c.aid):
                crs = self.device.using(a)
                if crs is None or {crs.src, crs.dst} != {a, b}:
                    raise Deny("IIAC", f"Invalid Connection: no connection "
                               f"{self.device.aid(a)},{self.device.aid(b)}")
                found.append(crs)
            return found
        # The short form ACT-CRS::::<name>; puts the name where the ctag block would end;
        # otherwise the name is in the last payload block (empty blocks before it skipped).
        names = [p.strip() for p in (c.last_block or c.gb).split(",") if p.strip()]
        found = [self.device.crs[n] for n in names if n in self.device.crs]
        if not found:
            raise Deny("IIAC", f"Invalid Connection: no connection named {quoted(c.params)}")
        return found

    async def _move(self, op: str, connect: list[tuple[int, int]],
                    disconnect: list[tuple[int, int]], arrived_ns: int) -> None:
        await self.model.change("tl1", op, connect, disconnect, arrived_ns)

    # -- verbs -----------------------------------------------------------------------------
    async def _rtrv_ne(self, c: Tl1Command, t: int) -> list[str]:
        o = self.device.options
        return [f"SERIALNUMBER={o.serial},SWPACKAGE={o.software},STATUS=OK,CHASSISTYPE={o.chassis}"]

    def _named_ports(self, aid: str) -> list[int]:
        """``0``, ``ALL`` or nothing: every port; else ``&``-joined shelf.slot.port AIDs."""
        if aid.upper() in ("", "0", "ALL"):
            return list(range(1, self.model.ports + 1))
        return [self.device.port(x) for x in aid.split("&")]

    async def _rtrv_port(self, c: Tl1Command, t: int) -> list[str]:
        ports = self._named_ports(c.aid)
        states = {"E": ("IS", "IS"), "D": ("OOS-MA", "OOS-MA"), "F": ("IS", "OOS-AU")}
        form = self.device.port_fields
        lines = []
        for p in ports:
            admin, oper = states[self.model.state_of(p)]
            if form == "positional":
                # <type>,<in role>,<out role> then per-direction states, as the S162 rows in
                # Quali's driver tests; the roles' meaning is not documented [?].
                role = "TRANSIT" if self.device.using(p) else "NONE"
                lines.append(f"{self.device.aid(p)}:WX,{role},{role}:INAS={admin},"
                             f"INOS={oper},INOC=OK,INRS=NPR,OUTAS={admin},OUTOS={oper},"
                             "OUTOC=OK,OUTRS=NPR")
            else:
                lines.append(f"{self.device.aid(p)}:TYPE=OPTICAL,AS={admin},OS={oper},ALIAS=")
        return lines

    async def _rtrv_port_sum(self, c: Tl1Command, t: int) -> list[str]:
        """Per port: alias, powers and the connection through it (``CONNNAME1``), whose
        state is ``ACT`` when active and ``NONE`` when only entered, as in Quali's driver
        tests; a port carries at most one connection here, so the second is ``NONE``."""
        lines = []
        for p in self._named_ports(c.aid):
            crs = self.device.using(p)
            name = crs.name if crs else "NONE"
            state = "ACT" if crs and crs.active else "NONE"
            power = self.model.power_dbm(p)
            inpwr = f"{power:.2f}" if power > -60 else "NONE"
            lines.append(f"{self.device.aid(p)}:ALIAS=NONE,INPWR={inpwr},OUTPWR=NONE,"
                         f"CONNNAME1={name},CONNSTATE1={state},CONNNAME2=NONE,"
                         "CONNSTATE2=NONE")
        return lines

    async def _ent_crs(self, c: Tl1Command, t: int) -> None:
        pairs = self._pairs(c.aid)
        params = [p.strip() for p in c.last_block.split(",")]
        group = params[0] if params and params[0] else "SYSTEM"
        kind = params[1].upper() if len(params) > 1 and params[1] else "2WAY"
        names = params[2:]
        new: list[Crs] = []
        taken: set[int] = set()
        for i, (a, b) in enumerate(pairs):
            for p in (a, b):
                if self.device.using(p) or p in taken:
                    raise Deny("SROF", f"Invalid Connection: port {self.device.aid(p)} in use")
                if self.model.state_of(p) == "F":
                    raise Deny("SROF", f"Failed: port {self.device.aid(p)} has failed")
            if a == b:
                raise Deny("IIAC", "Invalid Connection: source equals destination")
            sep = "-" if kind == "2WAY" else ">"
            name = names[i] if i < len(names) and names[i] else (
                f"{self.device.aid(a)}{sep}{self.device.aid(b)}")
            new.append(Crs(a, b, group, name, kind))
            taken.update((a, b))
        for crs in new:
            self.device.add_crs(crs)

    async def _act_crs(self, c: Tl1Command, t: int) -> None:
        targets = [x for x in self._targets(c) if not x.active]
        try:
            plan = [self.model.canonical(x.src, x.dst) for x in targets]
        except ModelError as exc:
            raise Deny("IIAC", exc.message) from None
        for x in targets:
            x.active = True
        await self._move("act-crs", plan, [], t)

    async def _canc_crs(self, c: Tl1Command, t: int) -> None:
        targets = [x for x in self._targets(c) if x.active]
        for x in targets:
            x.active = False
        await self._move("canc-crs", [], [self.model.canonical(x.src, x.dst) for x in targets], t)

    async def _dlt_crs(self, c: Tl1Command, t: int) -> None:
        if not c.aid:
            # DLT-CRS::<src>,<dst>:<ctag>::,<group>,<name>: the name is the last parameter
            c = Tl1Command(c.verb, c.tid, c.aid, c.ctag, c.gb, c.last_block.split(",")[-1])
        targets = self._targets(c)
        await self._remove(targets, t)

    async def _dlt_all(self, c: Tl1Command, t: int) -> None:
        await self._remove(list(self.device.crs.values()), t)

    async def _remove(self, targets: list[Crs], t: int) -> None:
        active = [self.model.canonical(x.src, x.dst) for x in targets if x.active]
        for x in targets:
            self.device.drop_crs(x)
        await self._move("dlt-crs", [], active, t)

    async def _rtrv_crs(self, c: Tl1Command, t: int) -> list[str]:
        rows = list(self.device.crs.values())
        if c.aid:
            rows = self._targets(c)
        lines = []
        for x in rows:
            state = "AS=IS,OS=IS,OC=OK" if x.active else "AS=UMA,OS=RDY,OC=OK"
            lines.append(f"{x.name}:SRCPORT={self.device.aid(x.src)},"
                         f"DSTPORT={self.device.aid(x.dst)},GRPNAME={x.group},"
                         f"CONNNAME={x.name},CONNTYPE={x.kind},{state}")
        return lines
