"""The mesh emulator's settled routes and ground truth, worked out on every heater command
by its quick path, against a straightforward full recomputation: each MZI's 2x2 transfer
applied step by step from phases the test derives itself from the voltages it sent."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from emulators.devices.qontrol import MeshDevice, QontrolOptions, QontrolSession
from emulators.physics.mesh import MeshModel, MeshOptions, Mzi, Perm


def reference_transfer(model: MeshModel, phases: list[float]) -> np.ndarray:
    """N x N settled power transfer (inputs as rows) of ``phases``, one step at a time."""
    n = model.ports
    amp = np.eye(n, dtype=complex)  # amp[input, line]
    for step in model.steps:
        if isinstance(step, Perm):
            moved = np.empty_like(amp)
            for line, target in enumerate(step.lines):
                moved[:, target] = amp[:, line]
            amp = moved
            continue
        assert isinstance(step, Mzi)
        k1, k2 = model.kappa[step.element]
        coupler1 = np.array([[math.sqrt(1 - k1), 1j * math.sqrt(k1)],
                             [1j * math.sqrt(k1), math.sqrt(1 - k1)]])
        coupler2 = np.array([[math.sqrt(1 - k2), 1j * math.sqrt(k2)],
                             [1j * math.sqrt(k2), math.sqrt(1 - k2)]])
        shifter = np.diag([np.exp(1j * phases[step.element]), 1.0])
        mzi = coupler2 @ shifter @ coupler1
        pair = amp[:, [step.a, step.b]]
        amp[:, [step.a, step.b]] = pair @ mzi.T
    power: np.ndarray = np.abs(amp) ** 2
    return power


def reference_routes(model: MeshModel, phases: list[float]) -> dict[int, int]:
    transfer = reference_transfer(model, phases)
    return {i + 1: model.ports + int(np.argmax(transfer[i])) + 1 for i in range(model.ports)}


class Reference:
    """The settled state the test expects, from what it sent: each heater's phase is its
    true alpha times V² unless the heater is dead (then 0)."""

    def __init__(self, model: MeshModel) -> None:
        self.model = model
        self.volts = [0.0] * model.elements
        self.dead: set[int] = set()
        self.routes = reference_routes(model, self.phases())

    def phases(self) -> list[float]:
        return [0.0 if e in self.dead else self.model.true_alpha[e] * v * v
                for e, v in enumerate(self.volts)]

    def step(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The routes now and the pairs connected and disconnected since the last step."""
        before, self.routes = self.routes, reference_routes(self.model, self.phases())
        return (sorted((a, b) for a, b in self.routes.items() if before[a] != b),
                sorted((a, b) for a, b in before.items() if self.routes[a] != b))


def a_voltage(rng: random.Random, v_pi: float) -> float:
    """A driver's bar or cross voltage most of the time, any voltage on the board's scale
    otherwise (4 decimals, as the wire carries it)."""
    return round(rng.choice([0.0, v_pi, v_pi, rng.uniform(0.0, 12.0)]), 4)


@pytest.mark.parametrize("ports", [4, 8, 16])
async def test_routes_and_truth_match_a_full_recomputation(ports: int) -> None:
    """Random single ``V`` writes, ``VVEC`` batches (over non-heater channels too), heaters
    dying and coming back, some commands in the middle of the previous one's transient:
    after each, the emulator's routes are the recomputed ones and its one new truth record
    holds exactly the pairs that changed, stamped with the command's arrival and
    settling; the settled transfer is the full propagation's."""
    rng = random.Random(ports)
    device = MeshDevice("mesh", QontrolOptions(ports=ports, calibration_error=0.05,
                                               coupler_error=0.03, ack=True))
    model = device.mesh
    session = QontrolSession(device)
    expected = Reference(model)
    assert model.routes == expected.routes
    tau_ns = int(model.options.tau_us * 1000)
    now = 10**12
    seen = len(model.truth.since())
    changed_routes = 0
    for _ in range(400):
        # Mostly long after the last command; sometimes inside its transient.
        now += rng.choice([tau_ns // 3, 2 * tau_ns, 10**6])
        kind = rng.choice(["v", "v", "vvec", "vvec", "dead", "revive"])
        op = "heaters"
        if kind == "v":
            channel = rng.randrange(device.channels)
            value = a_voltage(rng, model.options.v_pi)
            assert await session.handle(f"v{channel}={value}".encode(), now) == b"OK\n"
            if channel < model.elements:
                expected.volts[channel] = value
            else:
                continue  # a channel with no heater: the chip records nothing
        elif kind == "vvec":
            first = rng.randrange(model.elements)
            count = rng.randint(1, min(8, device.channels - first))
            values = [a_voltage(rng, model.options.v_pi) for _ in range(count)]
            text = f"vvec{first}=" + ",".join(str(v) for v in values)
            assert await session.handle(text.encode(), now) == b"OK\n"
            for offset, value in enumerate(values):
                if first + offset < model.elements:
                    expected.volts[first + offset] = value
        elif kind == "dead":
            element = rng.randrange(model.elements)
            model.kill_heater(element, now)
            expected.dead.add(element)
            op = "heater-dead"
        else:
            if not expected.dead:
                continue
            element = rng.choice(sorted(expected.dead))
            model.revive_heater(element, now)
            expected.dead.discard(element)
            op = "heater-revived"
        connected, disconnected = expected.step()
        changed_routes += bool(connected)
        records = model.truth.since(seen)
        seen += len(records)
        assert len(records) == 1, f"{kind}: one command, one record"
        (change,) = records
        assert model.routes == expected.routes, kind
        assert (change.op, list(change.connected), list(change.disconnected)) == (
            op, connected, disconnected), kind
        assert (change.arrived_ns, change.settled_ns) == (now, now + 5 * tau_ns)
        far = np.array([now + 10**12])
        assert np.array_equal(model.transfer_now(),
                              model._propagate(list(range(1, ports + 1)),
                                               model.phases_at(far))[0])
        assert np.allclose(model.transfer_now(), reference_transfer(model, expected.phases()),
                           rtol=0, atol=1e-12)
    assert changed_routes > 20, "the sequence must move light, not only rewrite it"


def test_a_write_keeps_the_light_model_continuous_and_its_cache_alone() -> None:
    """A heater rewritten mid-transient starts from where it is (the phase is continuous
    across the command), and the write leaves the optical model's cached phases as they
    are (working out the routes used to replace them with one far-future instant)."""
    model = MeshModel("m", MeshOptions(ports=8, tau_us=6.0))
    t0 = 10**12
    model.apply_voltages({0: 5.0, 3: 2.0}, t0, "test")
    times = np.arange(t0, t0 + 60_000, 1_000, dtype=np.int64)
    model.propagate([1, 2], times)
    cached = model._phase_cache
    mid = t0 + 9_000
    before = model.phases_at(np.array([mid]))[0]
    model.apply_voltages({0: 1.0}, mid, "test")
    assert model._phase_cache is cached
    after = model.phases_at(np.array([mid, mid + 1]))
    assert np.allclose(after[0], before, rtol=0, atol=1e-12)
    assert 0 < model.true_alpha[0] * 1.0 < after[1][0] < before[0]  # now falling toward 1 V


def test_outputs_too_close_to_rank_are_ranked_by_the_step_by_step_path() -> None:
    """Perfect couplers and heaters at π/2 split light evenly: no quick path can rank such
    outputs, and the routes are then the step-by-step propagation's (which defined them)."""
    model = MeshModel("m", MeshOptions(ports=4, coupler_error=0.0))
    targets = tuple([math.pi / 2] * model.elements)
    assert model._column_routes(targets) is None
    transfer = model._propagate([1, 2, 3, 4], np.array([targets]))[0]
    assert model._settled_routes(targets) == {
        i + 1: 5 + int(np.argmax(transfer[i])) for i in range(4)}


def test_past_light_uses_the_settings_of_its_time_many_changes_later() -> None:
    """The optical model asks for a change's light only when someone wants its crossings,
    perhaps hundreds of commands later: each instant still gets the settings current then
    (as replaying every saved setting, newest first, gives), at the cost of one pass."""
    rng = random.Random(3)
    model = MeshModel("m", MeshOptions(ports=8, tau_us=6.0))
    now = 10**12
    stamps = []
    for _ in range(300):
        now += rng.choice([2_000, 9_000, 400_000])
        stamps.append(now)
        model.apply_voltages({rng.randrange(model.elements): rng.uniform(0, 12)
                              for _ in range(rng.randint(1, 4))}, now, "test")
    for first in (stamps[5], stamps[150], stamps[-3]):
        times = np.arange(first - 50_000, first + 1_200_000, 100, dtype=np.int64)
        replayed = model._phases_replayed(times, model._phases(times))
        assert np.array_equal(model.phases_at(times), replayed)
