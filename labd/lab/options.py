"""What each emulator accepts in ``[instrument.emulator].options``: names, types and values,
so a lab file with a mistyped or out-of-range option is refused when it is read (by
``labd check`` too), not when an emulator trips over it. The names match the emulators'
option classes (a test holds them together); see docs/emulators.md."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from instruments.switch import parse_size
from labd.lab.limits import MAX_PORTS_PER_SIDE

Text = Annotated[str, Field(max_length=128)]
Users = Annotated[dict[Annotated[str, Field(min_length=1, max_length=64)],
                       Annotated[str, Field(max_length=128)]], Field(max_length=64)]
Seed = Annotated[int, Field(ge=0, lt=2**63)]
#: A Polatis switch's TL1 name, as its emulator's SET-SID takes it: it heads every output
#: block, so nothing that could break the framing; empty for none (shown as ``( nil )``).
SID = re.compile(r"[A-Za-z0-9_.-]{0,20}", re.ASCII)
Noise = Annotated[float, Field(ge=0, le=20)]


class Options(BaseModel):
    # Strict: the emulator gets the values as written, so "true" must not pass for true.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class PolatisOptions(Options):
    size: Text | None = None
    product: Text = "N-OST"
    serial: Text = ""
    firmware: Text = ""
    sid: Text = ""
    users: Users = Field(default_factory=dict)
    busy_port: Literal["deny", "replace"] = "deny"
    port_quotes: bool = True
    error_format: Annotated[str, Field(max_length=128)] = '{code}, "{text}"'
    joined_replies: bool = True
    autonomous: bool = True
    input_dbm: Annotated[float, Field(ge=-80, le=30)] = -3.0
    loss_db: Annotated[float, Field(ge=0, le=60)] = 1.2
    boot_mode: Literal["DARK", "REST", "AUT"] = "DARK"

    @field_validator("size")
    @classmethod
    def _size(cls, value: str | None) -> str | None:
        if value is not None and parse_size(value)[1] == 0:
            raise ValueError(f"size {value!r}: a Polatis switch is NxM, e.g. '16x16'")
        return value

    @field_validator("sid")
    @classmethod
    def _sid(cls, value: str) -> str:
        if SID.fullmatch(value) is None:
            raise ValueError(f"sid {value[:40]!r}: up to 20 letters, digits, '-', '_' or "
                             "'.' (the switch's name in every TL1 output block), or empty")
        return value

    @field_validator("error_format")
    @classmethod
    def _format(cls, value: str) -> str:
        try:
            value.format(code=-100, text="Command error", signed="-100")
        except (ValueError, KeyError, IndexError, AttributeError) as exc:
            raise ValueError(f"{value!r} is not a format of {{code}}, {{signed}} and "
                             f"{{text}}: {exc}") from None
        return value


class CalientOptions(Options):
    ports: Annotated[int, Field(ge=2, le=MAX_PORTS_PER_SIDE)] = 320
    ports_per_slot: Annotated[int, Field(ge=1, le=128)] = 32
    serial: Text = ""
    software: Text = ""
    chassis: Text = ""
    sid: Text = ""
    users: Users = Field(default_factory=dict)
    prompt: Text = ""
    login_settle_ms: Annotated[float, Field(ge=0, le=60_000)] = 0.0


class KeysightOptions(Options):
    model: Literal["N7744A", "N7745A", "N7744C", "N7745C"] = "N7744A"
    serial: Text = ""
    firmware: Text = ""
    overrange: float = 9.91e37
    noise_db: Noise = 0.01
    seed: Seed | None = None


class ThorlabsOptions(Options):
    model: Text = "PM100D"
    serial: Text = ""
    firmware: Text = ""
    sensor: Text = ""
    sensor_serial: Text = ""
    sensor_min_nm: Annotated[float, Field(ge=100, le=20_000)] = 700.0
    sensor_max_nm: Annotated[float, Field(ge=100, le=20_000)] = 1800.0
    noise_db: Noise = 0.01
    sample_s: Annotated[float, Field(gt=0, le=10)] = 0.003
    seed: Seed | None = None


class MeshOptions(Options):
    ports: Annotated[int, Field(ge=2, le=64)] = 8
    coupler_error: Annotated[float, Field(ge=0, lt=0.5)] = 0.01
    tau_us: Annotated[float, Field(gt=0, le=1e6)] = 6.0
    v_pi: Annotated[float, Field(gt=0, le=12)] = 5.0
    calibration_error: Annotated[float, Field(ge=0, lt=1)] = 0.0
    seed: Seed = 7
    ack: bool = True
    error_padding: bool = True
    powered_up: bool = True
    serial_base: Annotated[int, Field(ge=0, le=0xFFFF)] = 0x01A0
    heater_ohms: Annotated[float, Field(gt=0, le=1e6)] = 500.0


#: driver → the options its emulator takes
OPTIONS: dict[str, type[Options]] = {
    "polatis-scpi": PolatisOptions,
    "polatis-tl1": PolatisOptions,
    "calient-tl1": CalientOptions,
    "qontrol-mesh": MeshOptions,
    "keysight-n77xx": KeysightOptions,
    "thorlabs-pm100": ThorlabsOptions,
}


def option_problems(driver: str, options: dict[str, Any]) -> list[str]:
    """One line per option of ``options`` the emulator of ``driver`` would not take, naming
    the option and saying what it takes."""
    model = OPTIONS.get(driver)
    if model is None:
        return []
    unknown = sorted(set(options) - set(model.model_fields))
    problems = [f"unknown option(s) {unknown}; known: "
                f"{', '.join(sorted(model.model_fields))}"] if unknown else []
    try:
        model.model_validate({k: v for k, v in options.items() if k not in unknown})
    except ValidationError as exc:
        problems.extend(_line(err) for err in exc.errors())
    return problems


def _line(err: Any) -> str:
    name = ".".join(str(p) for p in err["loc"]) or "options"
    message = str(err["msg"]).removeprefix("Value error, ")
    value = err.get("input")
    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
    return f"option {name!r}: {message} (got {shown})"
