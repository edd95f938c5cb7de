"""Where a daemon answers, and one of its switches or meters as coroutines on labd.client:
what the blocking facade, the ophyd-async Devices and the QCoDeS Instruments are built on.

A switch's map is read as the daemon observed it on the device; a change is a request to
the daemon's API, so it is recorded, timed, held against other requests and known to the
drift policy like any other. A port's ``output`` is its partner in a circuit (0: none); its
``power`` is the reading of the meter channel its output feeds, as the lab file wires it
(NaN where none does, or the meter read over range).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import numbers
import os
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from labd.client.api import DaemonClient
from labd.errors import DaemonError, RequestError
from labd.settings import daemon_table, resolve
from labd.token import find_token

#: Pairs as the API writes them: ``[[a, b], ...]``.
Pairs = list[list[int]]
#: A map as the frameworks are given one: ``{1: 17}``, ``{"1": 17}`` (a map read back from
#: a JSON document) or ``[(1, 17), ...]``.
MapLike = Mapping[int, int] | Mapping[str, int] | Iterable[Sequence[int]]

#: The addresses a daemon listens on that a client cannot call: it is reached locally.
_ANY_ADDRESS = {"", "0.0.0.0", "::"}


@dataclass(frozen=True)
class DaemonTarget:
    """A daemon's API: its URL, a key (its token, or an access file's key) and, for an
    ``https://`` daemon whose certificate the system does not know, the certificate to
    trust."""

    url: str = "http://127.0.0.1:8470"
    token: str | None = None
    ca: str | None = None

    @classmethod
    def from_lab(cls, lab_file: str | os.PathLike[str], *, token: str | None = None
                 ) -> DaemonTarget:
        """The daemon ``labd run LAB_FILE`` starts on this machine: its address and TLS from
        the file's ``[daemon]`` table and the ``LABD_*`` environment, as ``labd run`` reads
        them; the key ``token``, else its token file, else ``$LABD_TOKEN``, else the token
        file ``labd run`` made."""
        path = Path(lab_file)
        settings = resolve(files=[(str(path), daemon_table(path) or {})]).settings
        host = "127.0.0.1" if settings.host in _ANY_ADDRESS else settings.host
        if ":" in host:
            host = f"[{host}]"
        scheme = "https" if settings.tls_cert else "http"
        return cls(f"{scheme}://{host}:{settings.port}",
                   find_token(token, file=settings.token_file), settings.tls_cert)

    def client(self) -> DaemonClient:
        """A client on the running event loop (it belongs to that loop from then on)."""
        return DaemonClient(self.url, self.token, ca=self.ca)


def target_of(target: DaemonTarget | str | None = None, *, token: str | None = None,
              lab: str | os.PathLike[str] | None = None) -> DaemonTarget:
    """A target from what a framework's constructor was given: a DaemonTarget, a URL (and
    ``token``), or ``lab``, the lab file the daemon runs; none of them: the local daemon on
    its default port, with ``$LABD_TOKEN`` or the token file."""
    if isinstance(target, DaemonTarget):
        return target
    if lab is not None:
        if target is not None:
            raise RequestError("give the daemon's URL or its lab file, not both")
        return DaemonTarget.from_lab(lab, token=token)
    return DaemonTarget(target or DaemonTarget.url, find_token(token))


def _port(value: object, what: str) -> int:
    """A port number from what a framework gives: an int (numpy's too), a whole float (a
    ``scan`` steps in floats: 9.0 is port 9), or digits (a key of a map read from JSON)."""
    if isinstance(value, bool):
        raise RequestError(f"{what} {value!r} is not a port number")
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and (whole := float(value)).is_integer():
        return int(whole)
    raise RequestError(f"{what} {value!r} is not a port number")


def pairs_of(value: MapLike | None) -> Pairs:
    """``[[a, b], ...]`` from a map as a framework gives one; None: no circuits."""
    if value is None:
        return []
    if isinstance(value, Mapping):
        items: Iterable[Any] = value.items()
    elif isinstance(value, Iterable) and not isinstance(value, str | bytes):
        items = value
    else:
        raise RequestError(f"cross-connects {value!r}: give a dict {{1: 17}} or pairs "
                           "[(1, 17)]")
    pairs = []
    for item in items:
        if not isinstance(item, Sequence) or isinstance(item, str | bytes) or len(item) != 2:
            raise RequestError(f"cross-connect {item!r} is not a pair of ports")
        a, b = item
        pairs.append([_port(a, "port"), _port(b, "port")])
    return pairs


def as_map(pairs: Iterable[Sequence[int]]) -> dict[int, int]:
    return {int(a): int(b) for a, b in pairs}


#: A hold's lease when the caller names none (s); it is renewed every third of it.
HOLD_TTL_S = 5.0


class HeldPorts:
    """A hold on ports of a switch (``/v1/holds``): taken by :meth:`take`, renewed every
    third of ``ttl_s`` on the client's loop until :meth:`release`. While it lasts, changes
    to these ports by anyone else are refused with ``holder`` named; a client that stops
    (a plan that dies, a process killed) stops renewing, and the hold ends ``ttl_s`` later.
    ``holds`` (switch → hold id) is where the switch adapters find it for their own
    changes."""

    def __init__(self, client: DaemonClient, switch: str, ports: Iterable[int], holder: str,
                 *, ttl_s: float = HOLD_TTL_S,
                 holds: MutableMapping[str, str] | None = None) -> None:
        self.client, self.switch, self.holder, self.ttl_s = client, switch, holder, ttl_s
        self.ports = [_port(p, "port") for p in ports]
        self.holds = holds if holds is not None else {}
        self.id: str | None = None
        self.lost: DaemonError | None = None
        """Why renewing failed (the hold has ended), if it did."""
        self._renewing: asyncio.Task[None] | None = None

    async def take(self) -> Self:
        answer = await self.client.hold(self.switch, self.ports, self.holder,
                                        ttl_s=self.ttl_s)
        self.id = str(answer["id"])
        self.holds[self.switch] = self.id
        self._renewing = asyncio.create_task(self._renew(), name=f"labd-hold-{self.id}")
        return self

    async def _renew(self) -> None:
        assert self.id is not None
        while True:
            await asyncio.sleep(self.ttl_s / 3)
            try:
                await self.client.renew_hold(self.id)
            except DaemonError as exc:  # ended (404) or the daemon out of reach
                self.lost = exc
                return

    async def release(self) -> None:
        if self._renewing is not None:
            self._renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewing
            self._renewing = None
        if self.id is not None:
            if self.holds.get(self.switch) == self.id:
                del self.holds[self.switch]
            hold, self.id = self.id, None
            with contextlib.suppress(DaemonError):  # ended already: nothing to let go
                await self.client.release_hold(hold)

    async def __aenter__(self) -> Self:
        return await self.take()

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.release()


class SwitchOnDaemon:
    """One switch of a daemon, on the event loop ``client`` belongs to; its changes name
    the hold ``holds`` has for it, if any (:class:`HeldPorts`)."""

    def __init__(self, client: DaemonClient, switch: str,
                 holds: Mapping[str, str] | None = None) -> None:
        self.client, self.switch = client, switch
        self.holds: Mapping[str, str] = holds if holds is not None else {}
        self._metered: dict[int, tuple[str, int]] | None = None

    def _change(self, **body: Any) -> dict[str, Any]:
        hold = self.holds.get(self.switch)
        return {**body, "hold": hold} if hold is not None else body

    async def state(self) -> dict[str, Any]:
        """``GET /v1/switches/{id}``: its state, size, intended and observed maps."""
        result: dict[str, Any] = await self.client.get(f"/v1/switches/{self.switch}")
        return result

    async def check(self) -> None:
        """That the daemon has this switch (DaemonError naming the ones it has)."""
        try:
            await self.state()
        except DaemonError as exc:
            if ": 404 " not in str(exc):
                raise
            listed = await self.client.get("/v1/instruments")
            switches = [i["id"] for i in listed if i.get("kind") == "switch"]
            raise DaemonError(f"the daemon at {self.client.url} has no switch "
                              f"{self.switch!r}; its switches: "
                              f"{', '.join(switches) or 'none'}") from None

    async def cross_connects(self) -> dict[int, int]:
        """The circuits as the daemon last read them from the device (ingress → egress)."""
        return as_map((await self.state())["observed"])

    async def replace(self, value: MapLike | None) -> dict[str, Any]:
        """Exactly these circuits (pairs that stay are not touched): one reconfiguration."""
        result: dict[str, Any] = await self.client.put(
            f"/v1/switches/{self.switch}/connections", self._change(pairs=pairs_of(value)))
        return result

    async def connect(self, value: MapLike) -> dict[str, Any]:
        result: dict[str, Any] = await self.client.post(
            f"/v1/switches/{self.switch}/connections", self._change(pairs=pairs_of(value)))
        return result

    async def disconnect(self, ports: Iterable[int]) -> dict[str, Any]:
        result: dict[str, Any] = await self.client.post(
            f"/v1/switches/{self.switch}/disconnect",
            self._change(ports=[_port(p, "port") for p in ports]))
        return result

    async def output(self, port: int) -> int:
        """The port ``port`` is in circuit with (0: none)."""
        observed = as_map((await self.state())["observed"])
        partner = {**observed, **{b: a for a, b in observed.items()}}
        return partner.get(_port(port, "port"), 0)

    async def set_output(self, port: int, output: int) -> dict[str, Any] | None:
        """Put ``port`` in circuit with ``output`` (0: in none), leaving every other circuit
        as it is: one reconfiguration, or none where it is so already. The rest of the map
        is the daemon's intended one, read just before."""
        port, output = _port(port, "port"), _port(output, "output")
        intended = as_map((await self.state())["intended"])
        partner = {**intended, **{b: a for a, b in intended.items()}}
        if partner.get(port, 0) == output:
            return None
        if output == 0:
            return await self.disconnect([port])
        kept = [[a, b] for a, b in intended.items() if not {a, b} & {port, output}]
        return await self.replace([*kept, [port, output]])

    async def metered(self) -> dict[int, tuple[str, int]]:
        """Each port of this switch that feeds a meter channel: (meter, channel)."""
        if self._metered is None:
            found: dict[int, tuple[str, int]] = {}
            for meter in await self.client.meters():
                for seen in meter["sees"]:
                    owner, _, number = str(seen["from"]).partition(":")
                    if owner == self.switch and number.isdigit():
                        found[int(number)] = (meter["id"], int(seen["channel"]))
            self._metered = found
        return self._metered

    async def power(self, port: int, output: int | None = None) -> float:
        """dBm at the meter channel ``port``'s output feeds (``output``: as just read);
        NaN where no meter is on it."""
        if output is None:
            output = await self.output(port)
        where = (await self.metered()).get(output)
        if where is None:
            return math.nan
        return await MeterOnDaemon(self.client, where[0]).read_power(where[1])


class MeterOnDaemon:
    """One power meter of a daemon, on the event loop ``client`` belongs to."""

    def __init__(self, client: DaemonClient, meter: str) -> None:
        self.client, self.meter = client, meter

    async def describe(self) -> dict[str, Any]:
        """``GET /v1/meters/{id}``: driver, state, channels, logging, what each sees."""
        try:
            result: dict[str, Any] = await self.client.get(f"/v1/meters/{self.meter}")
        except DaemonError as exc:
            if ": 404 " not in str(exc):
                raise
            raise DaemonError(f"the daemon at {self.client.url}: {exc}") from None
        return result

    async def read(self, channels: Sequence[int] | None = None, *, points: int = 1,
                   interval_s: float | None = None) -> dict[int, list[float]]:
        """Readings now, per channel (dBm; NaN where the meter read over range): one each
        by default, or a series (``points``, ``interval_s`` apart on a meter that logs)."""
        answer = await self.client.read_power(self.meter, channels, points=points,
                                              interval_s=interval_s)
        return {int(c): [math.nan if v is None else float(v) for v in values]
                for c, values in answer["channels"].items()}

    async def read_power(self, channel: int = 1) -> float:
        return (await self.read([channel]))[channel][0]
