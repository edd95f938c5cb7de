"""The bodies the API accepts, as pydantic models: an unknown field is refused (422), so a
misspelt option is never silently ignored; and nothing is coerced: a port is a JSON integer
(not ``"17"``, not ``true``), a flag a JSON boolean, every integer bounded."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

#: The largest integer the API takes anywhere (the store's 64-bit columns): beyond it, 422.
MAX_INT = 2**63 - 1
#: A port as a JSON integer; the switch's size is checked by the engine (404 beyond it).
Port = Annotated[int, Field(strict=True, ge=0, le=MAX_INT)]
#: A non-empty change: an empty one would be recorded as a change that did nothing.
MAX_PAIRS = 100_000

#: Why a change was asked for, as the store records it (recovery is the daemon's own).
Cause = Literal["api", "measurement", "schedule"]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChangeBody(Body):
    verify_light: StrictBool = True
    cause: Cause = Field("api", description="recorded with the reconfiguration")
    hold: str | None = Field(None, max_length=64, description=(
        "the id of the caller's hold (/v1/holds): its ports may be changed"))


class PairsBody(ChangeBody):
    pairs: list[tuple[Port, Port]] = Field(min_length=1, max_length=MAX_PAIRS,
                                           description="[[a, b], ...] port pairs")


class MapBody(ChangeBody):
    pairs: list[tuple[Port, Port]] = Field(max_length=MAX_PAIRS, description=(
        "[[a, b], ...] port pairs: the switch's whole map (empty: no circuits)"))


class PortsBody(ChangeBody):
    ports: list[Port] = Field(min_length=1, max_length=MAX_PAIRS)


class SpareBody(Body):
    endpoint: str = Field(description="endpoint id of a host's NIC")


class DecisionBody(Body):
    approve: StrictBool


class CircuitBody(ChangeBody):
    src: str = Field(alias="from")
    dst: str = Field(alias="to")


class DrillBody(Body):
    job: str | None = Field(None, description="default: the first job with spares")
    member: str | None = Field(None, description="the member to fail; default: one at random")
    kind: Literal["gpu", "host"] = Field("gpu", description="gpu: an Xid 79 on the member's "
                                         "GPU; host: the member's host stops reporting")
