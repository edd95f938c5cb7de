"""A HUBER+SUHNER Polatis switch: SCPI (port 5025 or a serial console) and TL1 (port 3082)
over one shared switch state. Behaviour follows docs/protocols.md §1; the [?] items are options:

``busy_port``        ``deny`` (refuse a connect onto a connected port) or ``replace``
``port_quotes``      PORT? answers ``"25"`` (True) or ``25`` (False)
``error_format``     how SYST:ERR? prints, default ``{code}, "{text}"``
``joined_replies``   answers to one compound line joined by ``;`` (True) or one line each
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from emulators.physics.crossconnect import ModelError, SwitchModel
from emulators.physics.timing import TimingModel
from emulators.wire.faults import Faults
from emulators.wire.numbers import wire_int
from emulators.wire.scpi import ScpiDeviceSession, ScpiError, format_list, parse_lists
from emulators.wire.server import Interface, Session, SessionInterface
from emulators.wire.tl1 import (
    Deny,
    Tl1Command,
    Tl1Session,
    autonomous,
    keyword_params,
    parse_ports,
    quoted,
)

_SID = re.compile(r"[A-Za-z0-9_.-]{1,20}", re.ASCII)
MAX_LABEL = 64
_LABEL = re.compile(rf'[ !#-\[\]-~]{{0,{MAX_LABEL}}}', re.ASCII)
#: Session timeouts ``ED-EQPT::TIMEOUT`` takes: stored and read back, never enforced (an
#: emulated session does not log itself out); the bound is labd's own.
MAX_TIMEOUT = 99999
_TL1_BOOT = {"DARK": "DARK", "REST": "RESTORE", "AUT": "AUT"}
_SCPI_REASON = {"range": (-222, "Data out of range"), "side": (-224, "Illegal parameter value"),
                "self": (-224, "Illegal parameter value"), "duplicate": (-224,
                "Illegal parameter value"), "busy": (-221, "Settings conflict"),
                "failed": (-240, "Hardware error")}
_TL1_REASON = {"range": "IIAC", "side": "IIAC", "self": "IIAC", "duplicate": "IPNV",
               "busy": "SROF", "failed": "SROF"}


@dataclass
class PolatisOptions:
    size: str = "16x16"
    product: str = "N-OST"
    serial: str = "002414"
    firmware: str = "6.5.2.18"
    sid: str = ""
    users: dict[str, str] = field(default_factory=lambda: {"admin": "root"})
    busy_port: str = "deny"
    port_quotes: bool = True
    error_format: str = '{code}, "{text}"'
    joined_replies: bool = True
    autonomous: bool = True
    input_dbm: float = -3.0
    loss_db: float = 1.2
    boot_mode: str = "DARK"
    """After a power cycle: DARK (no cross-connects) or REST (restore the last ones)."""


class PolatisSwitch:
    """The device: one model, faults, and the two management interfaces."""

    kind = "polatis"

    def __init__(self, name: str, options: PolatisOptions, timing: TimingModel) -> None:
        n, m = (int(x) for x in options.size.lower().split("x"))
        if not (1 <= n <= 384 and 1 <= m <= 384):
            raise ValueError(f"Polatis size {options.size}: each side must be 1..384")
        self.name = name
        self.options = options
        self.model = SwitchModel(name, n, m, timing=timing, busy_policy=options.busy_port,
                                 input_dbm=options.input_dbm, loss_db=options.loss_db)
        self.faults = Faults()
        self.labels: dict[int, str] = {}
        self.timeouts = {"ADMIN": 0, "USER": 0}
        self.scpi = SessionInterface("scpi", b"\n", lambda: PolatisScpiSession(self))
        self.tl1 = PolatisTl1Interface(self)

    @property
    def product_code(self) -> str:
        return f"{self.options.product}-{self.model.ingress}x{self.model.egress}-LA1-DMHNS"

    def idn(self) -> str:
        return f"Polatis,{self.product_code},{self.options.serial},{self.options.firmware}"

    def interfaces(self) -> dict[str, Interface]:
        return {"scpi": self.scpi, "tl1": self.tl1}

    def reset(self) -> None:
        self.model.reset()
        self.tl1.forget_alarms()
        self.faults.clear()

    def boot(self) -> None:
        """Power comes back: a dark boot loses every cross-connect, REST/AUT keep them."""
        self.faults.clear()
        if self.options.boot_mode.upper() == "DARK":
            self.model.reset()
            self.tl1.forget_alarms()

    def snapshot(self) -> dict[str, Any]:
        return self.model.snapshot()


# -- SCPI ---------------------------------------------------------------------------------



class PolatisScpiSession(ScpiDeviceSession):
    terminator = "\r\n"
    garbage = b"\x15#!?~garbage~?!#\r\n"

    def __init__(self, device: PolatisSwitch) -> None:
        self.device = device
        self.model = device.model
        opts = device.options
        table = {
            "*IDN?": lambda a, s: device.idn(),
            "*RST": self._rst,
            "*CLS": lambda a, s: self.state.errors.clear(),
            "*OPC?": lambda a, s: "1",
            "*OPC": lambda a, s: None,
            "*STB?": lambda a, s: "4" if self.state.errors else "0",
            ":OXC:SWITch:CONNect:ADD": self._add,
            ":OXC:SWITch:CONNect:SUB": self._sub,
            ":OXC:SWITch:CONNect:ONLY": self._only,
            ":OXC:SWITch:CONNect:STATe?": self._stat,
            ":OXC:SWITch:CONNect:PORT?": self._port,
            ":OXC:SWITch:DISConnect:ALL": self._disc_all,
            ":OXC:SWITch:SIZE?": lambda a, s: f"{self.model.ingress},{self.model.egress}",
            ":OXC:SWITch:PORT:STATe?": self._port_state,
            ":OXC:SWITch:PORT:DISable": lambda a, s: self._set_ports(a, "D"),
            ":OXC:SWITch:PORT:ENABle": lambda a, s: self._set_ports(a, "E"),
            ":OXC:BOOT:MODE?": lambda a, s: device.options.boot_mode,
            ":OXC:BOOT:MODE": self._boot_mode,
            ":SYSTem:ERRor?": lambda a, s: self.state.pop_error(),
            ":SYSTem:ERRor:NEXT?": lambda a, s: self.state.pop_error(),
            ":SYSTem:ERRor:ALL?": self._err_all,
            ":SYSTem:COMMunicate:NETWork:ADDRess?": lambda a, s: (
                'IP="127.0.0.1" Gateway="0.0.0.0" Mask="255.0.0.0" Broadcast="127.255.255.255"'),
        }
        if not opts.product.upper().startswith("I"):
            table[":PMON:POWer?"] = self._power
        super().__init__(table, error_format=opts.error_format,
                         joined_replies=opts.joined_replies)


    def _ports(self, args: str, count: int) -> list[list[int]]:
        lists = parse_lists(args, self.model.ports)
        if len(lists) != count:
            raise ScpiError(-109 if len(lists) < count else -108,
                            f"Expected {count} channel list(s)")
        return lists

    def _pairs(self, args: str) -> list[tuple[int, int]]:
        ingress, egress = self._ports(args, 2)
        if len(ingress) != len(egress):
            raise ScpiError(-224, "Illegal parameter value; lists differ in length")
        return list(zip(ingress, egress, strict=True))

    async def _apply(self, op: str, plan: Any) -> None:
        try:
            connect, disconnect = plan()
        except ModelError as exc:
            code, text = _SCPI_REASON[exc.reason]
            raise ScpiError(code, f"{text}; {exc.message}") from None
        await self.model.change("scpi", op, connect, disconnect, self.arrived_ns)
        # The next unit of the program message starts when this one is done.
        self.arrived_ns = time.monotonic_ns()

    async def _add(self, args: str, _: list[int]) -> None:
        pairs = self._pairs(args)
        await self._apply("add", lambda: self.model.plan_connect(pairs))

    async def _sub(self, args: str, _: list[int]) -> None:
        ingress, egress = self._ports(args, 2)
        if egress and len(egress) != len(ingress):
            raise ScpiError(-224, "Illegal parameter value; lists differ in length")

        def plan() -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
            if not egress:
                return [], self.model.plan_disconnect(ingress)
            pairs = [self.model.canonical(a, b) for a, b in zip(ingress, egress, strict=True)]
            return [], [p for p in pairs if self.model.connections.get(p[0]) == p[1]]

        await self._apply("sub", plan)

    async def _only(self, args: str, _: list[int]) -> None:
        pairs = self._pairs(args)
        await self._apply("only", lambda: self.model.plan_only(pairs))

    async def _disc_all(self, args: str, _: list[int]) -> None:
        await self._apply("disc-all", lambda: self.model.plan_only([]))

    async def _rst(self, args: str, _: list[int]) -> None:
        self.state.errors.clear()
        await self._disc_all(args, _)

    def _stat(self, args: str, _: list[int]) -> str:
        pairs = sorted(self.model.connections.items())
        return f"{format_list([a for a, _ in pairs])},{format_list([b for _, b in pairs])}"

    def _port(self, args: str, _: list[int]) -> str:
        try:
            port = wire_int(args.strip().strip("(@)"))
            self.model.check_port(port)
        except ValueError:
            raise ScpiError(-104, "Data type error; expected a port number") from None
        except ModelError as exc:
            raise ScpiError(-222, f"Data out of range; {exc.message}") from None
        partner = self.model.partner(port)
        text = "" if partner is None else str(partner)
        return f'"{text}"' if self.device.options.port_quotes else text

    def _list_or_all(self, args: str) -> list[int]:
        if not args.strip():
            return list(range(1, self.model.ports + 1))
        (ports,) = self._ports(args, 1)
        for p in ports:
            try:
                self.model.check_port(p)
            except ModelError as exc:
                raise ScpiError(-222, f"Data out of range; {exc.message}") from None
        return ports

    def _port_state(self, args: str, _: list[int]) -> str:
        return "(" + ",".join(self.model.state_of(p) for p in self._list_or_all(args)) + ")"

    def _set_ports(self, args: str, state: str) -> None:
        for p in self._list_or_all(args):
            if self.model.state_of(p) != "F":
                self.model.set_port_state(p, state, "scpi")

    def _power(self, args: str, _: list[int]) -> str:
        ports = self._list_or_all(args)
        return "(" + ",".join(f"{self.model.power_dbm(p):.2f}" for p in ports) + ")"

    def _boot_mode(self, args: str, _: list[int]) -> None:
        mode = args.strip().upper()
        if mode not in ("DARK", "REST", "AUT"):
            raise ScpiError(-224, "Illegal parameter value; expected DARK, REST or AUT")
        self.device.options.boot_mode = mode

    def _err_all(self, args: str, _: list[int]) -> str:
        entries = []
        while self.state.errors:
            entries.append(self.state.pop_error())
        return ",".join(entries) or self.state.pop_error()


# -- TL1 ----------------------------------------------------------------------------------

class PolatisTl1Interface(Interface):
    name = "tl1"
    separator = b";"

    def __init__(self, device: PolatisSwitch) -> None:
        self.device = device
        self.sessions: set[PolatisTl1Session] = set()
        self._atag = 0
        self._alarmed: set[int] = set()  # ports whose PORTFAIL alarm is raised
        device.model.listeners.append(self._on_change)
        device.model.port_listeners.append(self._on_port)

    def new_session(self) -> Session:
        session = PolatisTl1Session(self)
        self.sessions.add(session)
        return session

    def forget_alarms(self) -> None:
        """The model was reset (its ports enabled without a change each): no alarm stands."""
        self._alarmed.clear()

    def next_atag(self) -> int:
        self._atag += 1
        return self._atag

    def _listening(self) -> list[Any]:
        return [s for s in self.sessions if s.user is not None and s.autonomous_enabled
                and s.send]

    def _broadcast(self, verb_line: str, lines: Callable[[], list[str]],
                   alarm: str = "A") -> None:
        """Report to every listening session; ``lines`` are made only if one listens."""
        atag = self.next_atag()
        if not self._listening():
            return  # no TL1 session takes reports now: nothing to write, nor to schedule

        def deliver() -> None:
            listening = self._listening()
            if not listening:
                return
            block = autonomous(self.device.options.sid or "( nil )", atag, verb_line, lines(),
                               alarm)
            for session in listening:
                session.send(block)

        # Reports follow the response of the command that caused them, as on the device,
        # and are written after it: none of their cost is in the device's reply time.
        asyncio.get_running_loop().call_soon(deliver)

    def _on_change(self, change: Any) -> None:
        self._broadcast("REPT EVT PATCH", lambda: [
            *(f"{a},{b}:CONNECTED" for a, b in change.connected),
            *(f"{a},{b}:DISCONNECTED" for a, b in change.disconnected)])

    def _on_port(self, port: int, state: str) -> None:
        # A port failure raises an alarm and its repair clears it; a shutter closing or
        # opening is no alarm (the clear follows a raise only).
        if state == "F":
            self._alarmed.add(port)
            self._broadcast("REPT ALM PORT", lambda: [f"{port}:CR,PORTFAIL,SA"], alarm="*C")
        elif port in self._alarmed:
            self._alarmed.discard(port)
            self._broadcast("REPT ALM PORT", lambda: [f"{port}:CL,PORTFAIL,SA"], alarm="A")


class PolatisTl1Session(Tl1Session):
    def __init__(self, interface: PolatisTl1Interface) -> None:
        device = interface.device
        super().__init__(sid=device.options.sid or "( nil )", users=device.options.users,
                         autonomous_enabled=device.options.autonomous)
        self.interface = interface
        self.device = device
        self.model = device.model
        self.verbs.update({
            "RTRV-NETYPE": self._netype,
            "RTRV-INV": self._inv,
            "RTRV-EQPT": self._rtrv_eqpt,
            "ENT-PATCH": self._ent_patch,
            "DLT-PATCH": self._dlt_patch,
            "RTRV-PATCH": self._rtrv_patch,
            "RTRV-PORT-SHUTTER": self._rtrv_shutter,
            "OPR-PORT-SHUTTER": lambda c, t: self._shutter(c, "D"),
            "RLS-PORT-SHUTTER": lambda c, t: self._shutter(c, "E"),
            "RTRV-PORT-POWER": self._rtrv_power,
            "OPR-ARC-EQPT": self._inhibit,
            "RLS-ARC-EQPT": self._allow,
            "SET-SID": self._set_sid,
            "INIT-SYS": self._init_sys,
            "ED-EQPT": self._ed_eqpt,
            "ED-PORT-LABEL": self._ed_label,
            "RTRV-PORT-LABEL": self._rtrv_label,
            "SET-PORT-ATTEN": self._no_attenuation,
            "RTRV-PORT-ATTEN": self._no_attenuation,
        })

    async def greeting(self) -> bytes:
        return b""

    def closed(self) -> None:
        self.interface.sessions.discard(self)

    def reply(self, ctag: str, lines: list[str] | None = None, *,
              deny: Deny | None = None) -> bytes:
        self.sid = self.device.options.sid or "( nil )"
        return super().reply(ctag, lines, deny=deny)

    def _ports(self, aid: str) -> list[int]:
        if not aid:
            raise Deny("IPMS", "Missing AID")
        if aid.upper() == "ALL":
            return list(range(1, self.model.ports + 1))
        return parse_ports(aid, self.model.ports)

    async def _change(self, op: str, plan: Any, arrived_ns: int) -> None:
        try:
            connect, disconnect = plan()
        except ModelError as exc:
            raise Deny(_TL1_REASON[exc.reason], exc.message) from None
        await self.model.change("tl1", op, connect, disconnect, arrived_ns)

    async def _netype(self, c: Tl1Command, t: int) -> list[str]:
        return [f"Polatis,{self.device.product_code},OCS,{self.device.options.firmware}"]

    async def _inv(self, c: Tl1Command, t: int) -> list[str]:
        return [f"OCS:SN={self.device.options.serial},PN={self.device.product_code}"]

    async def _rtrv_eqpt(self, c: Tl1Command, t: int) -> list[str]:
        param = keyword_params(c.params).get("PARAMETER", "").upper()
        aid = c.aid.upper()
        timeouts = self.device.timeouts
        if aid == "SYSTEM" and param == "SIZE":
            return [f"SYSTEM:SIZE={self.model.ingress}x{self.model.egress}"]
        if aid == "TIMEOUT" and param in timeouts:
            return [f"TIMEOUT:{param}={timeouts[param]}"]
        if aid == "TIMEOUT" and not param:
            return ["TIMEOUT:" + ",".join(f"{k}={v}" for k, v in timeouts.items())]
        if aid == "BOOT" and param in ("", "MODE"):
            return [f"BOOT:MODE={_TL1_BOOT.get(self.device.options.boot_mode.upper(), 'DARK')}"]
        if aid == "ATTEN" and param in ("", "CONFIG"):
            # The emulated switch has no VOAs: the mode a client reads before it attenuates.
            return ["ATTEN:CONFIG=NONE"]
        raise Deny("IPNV", f"Parameter not valid: {quoted(c.aid)} {quoted(c.params)}")

    async def _ed_eqpt(self, c: Tl1Command, t: int) -> None:
        params = keyword_params(c.params)
        aid = c.aid.upper()
        if aid == "TIMEOUT" and params and set(params) <= set(self.device.timeouts):
            values = {}
            for key, text in params.items():
                try:
                    values[key] = wire_int(text)
                except ValueError:
                    values[key] = -1
                if not 0 <= values[key] <= MAX_TIMEOUT:
                    raise Deny("IPNV", f"Parameter not valid: {key}={quoted(text)} is not "
                               f"0..{MAX_TIMEOUT}")
            self.device.timeouts.update(values)
            return
        if aid == "BOOT" and set(params) == {"MODE"}:
            mode = {"RESTORE": "REST"}.get(params["MODE"].upper(), params["MODE"].upper())
            if mode not in ("DARK", "REST", "AUT"):
                raise Deny("IPNV", f"Parameter not valid: MODE={quoted(params['MODE'])}")
            self.device.options.boot_mode = mode
            return
        raise Deny("IPNV", f"Parameter not valid: {quoted(c.aid)} {quoted(c.params)}")

    async def _ed_label(self, c: Tl1Command, t: int) -> None:
        ports = self._ports(c.aid)
        block = c.last_block
        key, sep, value = block.partition("=")
        if not sep or key.strip().upper() != "LABEL":
            raise Deny("IPMS", "ED-PORT-LABEL needs LABEL=<label>")
        label = value.strip()
        if len(label) >= 2 and label[0] == label[-1] == '"':
            label = label[1:-1]
        # A label is echoed inside a quoted data line: nothing that would break its framing.
        if not _LABEL.fullmatch(label):
            raise Deny("IPNV", f"Parameter not valid: label {quoted(label)} is not 0 to "
                       f"{MAX_LABEL} printable characters without quotes or backslashes")
        for p in ports:
            self.device.labels[p] = label

    async def _rtrv_label(self, c: Tl1Command, t: int) -> list[str]:
        ports = self._ports(c.aid) if c.aid else list(range(1, self.model.ports + 1))
        return [f'{p}:LABEL=\\"{self.device.labels.get(p, "")}\\"' for p in ports]

    async def _no_attenuation(self, c: Tl1Command, t: int) -> None:
        raise Deny("IICM", "Attenuation not supported on this switch")

    async def _ent_patch(self, c: Tl1Command, t: int) -> None:
        ins, _, outs = c.aid.partition(",")
        if not outs:
            raise Deny("IPMS", "ENT-PATCH needs <ingress>,<egress>")
        a, b = self._ports(ins), self._ports(outs)
        if len(a) != len(b):
            raise Deny("IIAC", "Ingress and egress lists differ in length")
        await self._change("ent-patch", lambda: self.model.plan_connect(list(zip(a, b,
                                                                                strict=True))), t)

    async def _dlt_patch(self, c: Tl1Command, t: int) -> None:
        ports = self._ports(c.aid.split(",")[0])
        await self._change("dlt-patch", lambda: ([], self.model.plan_disconnect(ports)), t)

    async def _rtrv_patch(self, c: Tl1Command, t: int) -> list[str]:
        pairs = sorted(self.model.connections.items())
        if c.aid:
            wanted = set(self._ports(c.aid))
            pairs = [(a, b) for a, b in pairs if a in wanted or b in wanted]
        return [f"{a},{b}" for a, b in pairs]

    async def _rtrv_shutter(self, c: Tl1Command, t: int) -> list[str]:
        names = {"E": "OPEN", "D": "CLOSED", "F": "FAILED"}
        return [f"{p}:{names[self.model.state_of(p)]}" for p in self._ports(c.aid)]

    async def _shutter(self, c: Tl1Command, state: str) -> None:
        for p in self._ports(c.aid):
            if self.model.state_of(p) != "F":
                self.model.set_port_state(p, state, "tl1")

    async def _rtrv_power(self, c: Tl1Command, t: int) -> list[str]:
        if self.device.options.product.upper().startswith("I"):
            raise Deny("IICM", "Power monitoring not supported on this switch")
        return [f"{p}:{self.model.power_dbm(p):.2f}" for p in self._ports(c.aid)]

    async def _inhibit(self, c: Tl1Command, t: int) -> None:
        self.autonomous_enabled = False

    async def _allow(self, c: Tl1Command, t: int) -> None:
        self.autonomous_enabled = True

    async def _set_sid(self, c: Tl1Command, t: int) -> None:
        sid = c.last_block.strip('"')
        # The SID heads every output block of every session: nothing that breaks framing.
        if not _SID.fullmatch(sid):
            raise Deny("IPNV", f"Parameter not valid: SID {quoted(sid)} is not 1 to 20 "
                       "letters, digits, '-', '_' or '.'")
        self.device.options.sid = sid

    async def _init_sys(self, c: Tl1Command, t: int) -> None:
        if c.last_block in ("0", "1"):
            await self._change("init-sys", lambda: self.model.plan_only([]), t)
            for p in list(self.model.port_state):
                if self.model.state_of(p) == "D":
                    self.model.set_port_state(p, "E", "tl1")
            return
        raise Deny("IPNV", f"INIT-SYS phase {quoted(c.params)} not supported by the emulator")
