"""Planning a request on one switch: the smallest change against its intended state.

The request's pairs are checked once, by the switch's driver, and refused in the API's
terms; the plan is the pairs to make and to break, and a planned :class:`Change` also
carries what the engine holds and watches while it runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from instruments.errors import InvalidRequest, NoSuchPort
from instruments.switch import CheckedPairs, OpticalSwitch, Pair
from labd.errors import PortBusy, RequestError, UnknownPort
from labd.fabric.light import Watched

__all__ = ["Change", "checked", "checked_port", "replacing", "smallest"]


def checked(switch: OpticalSwitch,
            pairs: Iterable[Pair] | Mapping[int, int] | CheckedPairs) -> CheckedPairs:
    """The request's pairs as the switch checks them (the one place they are checked;
    checked pairs pass through): its refusals in the API's terms."""
    try:
        return switch.check_pairs(pairs)
    except NoSuchPort as exc:
        raise UnknownPort(exc.message) from None
    except InvalidRequest as exc:
        raise RequestError(exc.message) from None


def checked_port(switch: OpticalSwitch, port: int) -> int:
    try:
        return switch.check_port(port)
    except InvalidRequest as exc:
        raise UnknownPort(exc.message) from None


def replacing(intended: Mapping[int, int], target: Mapping[int, int]
              ) -> tuple[list[Pair], list[Pair]]:
    """(pairs to make, pairs to break) to go from ``intended`` to ``target``, both canonical."""
    return (sorted((a, b) for a, b in target.items() if intended.get(a) != b),
            sorted((a, b) for a, b in intended.items() if target.get(a) != b))


def smallest(name: str, switch: OpticalSwitch, intended: Mapping[int, int],
             connect: CheckedPairs, disconnect: Iterable[int]
             ) -> tuple[list[Pair], list[Pair]]:
    """(pairs to make, pairs to break) to connect and disconnect on top of ``intended``:
    a pair already there is left alone, a port in another circuit is refused."""
    partner = {**intended, **{b: a for a, b in intended.items()}}
    make = []
    for a, b in connect.pairs:
        if intended.get(a) == b:
            continue  # already there: nothing to do
        for port in (a, b):
            if port in partner:
                raise PortBusy(f"{name} port {port} is already in circuit "
                               f"{min(port, partner[port])}-{max(port, partner[port])}")
        make.append((a, b))
    brk = sorted({(min(p, partner[p]), max(p, partner[p]))
                  for p in (checked_port(switch, q) for q in disconnect) if p in partner})
    return make, brk


@dataclass(slots=True)
class Change:
    """One request on one switch as planned, and planned again once its ports are held."""

    name: str
    switch: OpticalSwitch
    asked: CheckedPairs | None
    """The pairs to connect, checked (None for a whole-map replacement)."""
    disconnect: Iterable[int]
    whole: CheckedPairs | None
    """A whole-map replacement as the driver takes it, checked."""
    target: dict[int, int] | None
    """A whole-map replacement's map: the intended state once it is done."""
    current: dict[int, int] | None
    """What the switch holds, for a restore planned against it rather than the intention."""
    verify_light: bool
    make: list[Pair]
    brk: list[Pair]
    keys: frozenset[tuple[str, int]]
    """What the request holds while it runs: its ports and its meter channels."""
    watched: Watched
