"""The one lab-file factory of the tests: entries as TOML text, put together and written with
a lab name no other run uses (retained MQTT topics outlive a test, and two runs of the suite
may share a broker).

    name, path = write_lab(tmp_path, "camp", switch(size="8x8", switch_ms=1))
    lab = load_lab(path)

A rig (emulators, emulated hosts, a daemon) on such a lab: the ``start_rig`` fixture
(tests/rigs.py).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any


def _value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_value(v)}" for k, v in value.items()) + " }"
    return str(value)


def _table(header: str, fields: dict[str, Any]) -> str:
    lines = [header] + [f"{k} = {_value(v)}" for k, v in fields.items() if v is not None]
    return "\n".join(lines) + "\n"


def instrument(id: str, driver: str, *, emulator: dict[str, Any] | None = None,
               **fields: Any) -> str:
    """An ``[[instrument]]`` entry, emulated unless ``emulate=False`` is given; ``emulator``
    holds its ``[instrument.emulator]`` table."""
    text = _table("[[instrument]]", {"id": id, "driver": driver, "emulate": True, **fields})
    if emulator:
        text += _table("[instrument.emulator]", emulator)
    return text


def switch(id: str = "ocs1", *, driver: str = "polatis-scpi", size: str = "8x8",
           switch_ms: float | None = None, jitter_ms: float | None = 0,
           technology: str | None = None, **fields: Any) -> str:
    """An emulated switch; with ``switch_ms`` (or ``technology``) its timing model."""
    emulator = {"technology": technology, "switch_time_ms": switch_ms,
                "jitter_ms": jitter_ms if switch_ms is not None else None}
    emulator = {k: v for k, v in emulator.items() if v is not None}
    return instrument(id, driver, size=size, emulator=emulator or None, **fields)


def meter(id: str = "pm1", *, driver: str = "keysight-n77xx", **fields: Any) -> str:
    """An emulated power meter."""
    return instrument(id, driver, **fields)


def endpoint(id: str, launch_dbm: float | None = None) -> str:
    return _table("[[endpoint]]", {"id": id, "launch_dbm": launch_dbm})


def fiber(src: str, dst: str, **fields: Any) -> str:
    return _table("[[fiber]]", {"from": src, "to": dst, **fields})


def metered(src: str, dst: str, ingress: int, egress: int, channel: int, *,
            switch: str = "ocs1", meter: str = "pm1") -> str:
    """A path through ``switch`` from ``src`` to ``dst``, its receiving fibre tapped to
    ``meter``'s ``channel``."""
    return (endpoint(src, launch_dbm=0) + endpoint(dst)
            + fiber(src, f"{switch}:{ingress}")
            + fiber(f"{switch}:{egress}", dst, tap=f"{meter}:{channel}", tap_ratio=0.1))


def host(id: str, *, nics: list[str] | None = None, emulate: bool = True,
         **fields: Any) -> str:
    """A GPU host (``nics`` default: ``<id>.nic0``). An emulated one has one GPU and a 0.2 s
    heartbeat unless told otherwise (quick to start, quick to miss); one whose agents the
    test runs itself (``emulate=False``) has only the fields given."""
    defaults: dict[str, Any] = {"gpus": 1, "heartbeat_s": 0.2} if emulate else {}
    return _table("[[host]]", {"id": id, "nics": nics or [f"{id}.nic0"], "emulate": emulate,
                               **defaults, **fields})


def job(id: str, members: list[str], *, topology: str = "ring",
        emulator: dict[str, Any] | None = None, **fields: Any) -> str:
    """A ``[[job]]`` over ``members``; ``emulator`` holds its ``[job.emulator]`` table."""
    text = _table("[[job]]", {"id": id, "topology": topology, "members": members, **fields})
    if emulator:
        text += _table("[job.emulator]", emulator)
    return text


def unique_name(tag: str) -> str:
    """``tag`` + a random suffix: a lab name no other run uses."""
    return f"{tag}{uuid.uuid4().hex[:8]}"


def write_lab(tmp_path: Path, tag: str, *parts: str, name: str | None = None,
              file: str = "lab.toml") -> tuple[str, Path]:
    """Write ``file`` in ``tmp_path``: a ``[lab]`` named ``unique_name(tag)`` (or ``name``),
    then ``parts``. Returns (the lab's name, the file)."""
    name = name or unique_name(tag)
    path = tmp_path / file
    path.write_text(f'[lab]\nname = "{name}"\n' + "".join(parts))
    return name, path


HOSTS = (("h0", "r1"), ("h1", "r1"), ("h2", "r2"), ("h3", "r2"), ("s0", "r1"), ("s1", "r2"))


def ring_lab(recovery: str = "automatic") -> str:
    """The failover tests' lab: a ring job of four GPU hosts with two spares (``HOSTS``:
    name and rack), on one 16x16 OCS (10 ms switch model), a monitor tap on every
    receiver."""
    parts = [switch(size="16x16", technology="beam-steering", switch_ms=10), meter(channels=8)]
    for i, (name, rack) in enumerate(HOSTS):
        nic = f"{name}.nic0"
        parts += [endpoint(nic, launch_dbm=0.0), fiber(nic, f"ocs1:{i + 1}"),
                  fiber(f"ocs1:{17 + i}", nic, tap=f"pm1:{i + 1}", tap_ratio=0.05),
                  host(name, rack=rack, heartbeat_s=0.5)]
    parts.append(job("ring4", [f"{name}.nic0" for name, _ in HOSTS[:4]],
                     spares=["s0.nic0", "s1.nic0"], recovery=recovery, link_timeout_s=10,
                     start_timeout_s=20, emulator={"init_ms": 20, "step_ms": 10}))
    return "".join(parts)
