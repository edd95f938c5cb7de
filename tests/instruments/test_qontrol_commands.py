"""What the Qontrol and mesh drivers put on the line: the fewest bytes for a change (runs
as vector commands, within a module, over unchanged channels only where what they hold is
known), numbers without trailing zeros, the board and the driver agreeing on every
heater's voltage afterwards, and the thermal settling waited in full on either loop."""

from __future__ import annotations

import itertools
import random
import time

import pytest

from emulators.lab import EmulatedLab, EmulatorSpec, ServeSpec
from instruments.mesh import MeshSwitch
from instruments.qontrol import MODULE_CHANNELS, number, vector_commands
from labd.runtime import run

ACK = 3  # "OK" and LF, the board's answer to each set command


def applied(commands: list[str], known: dict[int, float]) -> dict[int, float]:
    """The channels a board holds after ``commands``, starting from ``known``."""
    held = dict(known)
    for command in commands:
        head, _, values = command.partition("=")
        if head.startswith("vvec"):
            first = int(head[4:])
            parts = values.split(",")
            assert first // MODULE_CHANNELS == (first + len(parts) - 1) // MODULE_CHANNELS, (
                f"{command}: a vector leaves its module")
            for offset, text in enumerate(parts):
                held[first + offset] = float(text)
        else:
            held[int(head[1:])] = float(values)
    return held


def cheapest(volts: dict[int, float], known: dict[int, float]) -> int:
    """The fewest bytes any split of each module into runs needs (every split tried)."""
    total = 0
    modules: dict[int, list[int]] = {}
    for channel in sorted(volts):
        modules.setdefault(channel // MODULE_CHANNELS, []).append(channel)
    for channels in modules.values():
        best = None
        for cuts in itertools.product([False, True], repeat=len(channels) - 1):
            runs, current = [], [channels[0]]
            for channel, cut in zip(channels[1:], cuts, strict=True):
                if cut:
                    runs.append(current)
                    current = []
                current.append(channel)
            runs.append(current)
            size = 0
            for chosen in runs:
                if len(chosen) == 1:
                    size += len(f"v{chosen[0]}={number(volts[chosen[0]])}") + 1 + ACK
                    continue
                span = range(chosen[0], chosen[-1] + 1)
                if any(c not in volts and c not in known for c in span):
                    break
                texts = [number(volts[c]) if c in volts else number(known[c]) for c in span]
                size += len(f"vvec{chosen[0]}=" + ",".join(texts)) + 1 + ACK
            else:
                best = size if best is None else min(best, size)
        assert best is not None
        total += best
    return total


def test_numbers_carry_no_trailing_zeros() -> None:
    assert [number(v) for v in (0.0, 5.0, 3.53553, 1.2, 12.0, 0.00004, 4.99999)] == [
        "0", "5", "3.5355", "1.2", "12", "0", "5"]


def test_a_change_is_the_fewest_bytes_and_sets_exactly_what_was_asked() -> None:
    """Random changes over a three-module board, some channels' contents known: the
    commands set every changed channel, leave every other channel as it was, never run a
    vector over a channel whose contents are unknown or past its module, and take the
    fewest bytes of any split into runs."""
    rng = random.Random(5)
    for _ in range(300):
        channels = 24
        known = {c: rng.choice([0.0, 5.0, round(rng.uniform(0, 12), 4)])
                 for c in range(channels) if rng.random() < 0.7}
        volts = {c: rng.choice([0.0, 5.0, rng.uniform(0, 12)])
                 for c in range(channels) if rng.random() < 0.4}
        if not volts:
            continue
        commands = vector_commands(volts, known=known)
        held = applied(commands, known)
        for channel in range(channels):
            if channel in volts:
                assert held[channel] == float(number(volts[channel]))
            elif channel in known:
                assert held[channel] == known[channel]
            else:
                assert channel not in held, f"{commands}: ran over unknown channel {channel}"
        size = sum(len(c) + 1 + ACK for c in commands)
        assert size == cheapest(volts, known), commands
    # Without known contents, only runs of changed channels become vectors.
    assert vector_commands({0: 5.0, 1: 0.0, 2: 5.0, 7: 5.0, 8: 1.5, 9: 0.0}) == [
        "vvec0=5,0,5", "v7=5", "vvec8=1.5,0"]


def test_the_settling_is_waited_in_full_on_uvloop() -> None:
    """uvloop runs a timer shorter than a millisecond at once: the driver's settling
    (here 200 µs) must not end before the monotonic clock says it has passed."""
    mesh = MeshSwitch("serial:///dev/null", name="mesh", size="8x8", settle_us=200)

    async def waited() -> float:
        start = time.monotonic()
        await mesh._settle()
        return time.monotonic() - start

    assert all(run(waited()) >= mesh.settle_s for _ in range(20))


async def test_the_board_holds_what_the_driver_believes_after_each_change() -> None:
    """A board that held an odd voltage before the driver came: random replaces leave
    every heater at the voltage the driver believes it sent, every heater whose state did
    not change exactly where it was (a vector run over it re-sends its own value), and the
    line carries fewer bytes than a command per changed channel would."""
    rng = random.Random(8)
    spec = EmulatorSpec("mesh", "mesh", {"ports": 8}, {},
                        serve={"serial": ServeSpec(serve="pty")})
    async with EmulatedLab([spec]) as lab:
        board = lab.device("mesh")
        board.set_volts(5, [2.3456], time.monotonic_ns())  # type: ignore[attr-defined]
        async with MeshSwitch(lab.endpoints["mesh"]["serial"], name="mesh",
                              size="8x8") as mesh:
            assert mesh.volts[5] == 2.3456
            link = mesh.connection.link
            for _ in range(60):
                outputs = list(range(9, 17))
                rng.shuffle(outputs)
                before_states = dict(mesh.states)
                before_volts = list(board.volts)  # type: ignore[attr-defined]
                sent = link.bytes_out + link.bytes_in
                await mesh.replace(dict(zip(range(1, 9), outputs, strict=True)))
                sent = link.bytes_out + link.bytes_in - sent
                changed = [k for k in range(mesh.elements)
                           if mesh.states[k] != before_states[k]]
                singles = sum(len(f"v{k}={number(mesh.volts_for(k, mesh.states[k]))}")
                              + 1 + ACK for k in changed) + len("nchan?\n24\n")
                assert sent <= singles
                volts = board.volts  # type: ignore[attr-defined]
                assert all(volts[k] == mesh.volts[k] for k in range(mesh.elements))
                assert all(volts[k] == before_volts[k] for k in range(mesh.elements)
                           if k not in changed)


@pytest.mark.parametrize("ack", [True, False])
async def test_a_board_without_acks_takes_the_same_commands(ack: bool) -> None:
    spec = EmulatorSpec("mesh", "mesh", {"ports": 8, "ack": ack}, {},
                        serve={"serial": ServeSpec(serve="pty")})
    async with EmulatedLab([spec]) as lab:
        chip = lab.device("mesh").mesh  # type: ignore[attr-defined]
        async with MeshSwitch(lab.endpoints["mesh"]["serial"], name="mesh",
                              size="8x8") as mesh:
            target = {1: 16, 2: 15, 3: 14, 4: 13, 5: 12, 6: 11, 7: 10, 8: 9}
            await mesh.replace(target)
            assert all(chip.routes[a] == b for a, b in target.items())
