"""The bodies the API accepts, as pydantic models: an unknown field is refused (422), so a
misspelt option is never silently ignored."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: Why a change was asked for, as the store records it (recovery is the daemon's own).
Cause = Literal["api", "measurement", "schedule"]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ChangeBody(Body):
    verify_light: bool = True
    cause: Cause = Field("api", description="recorded with the reconfiguration")


class PairsBody(ChangeBody):
    pairs: list[tuple[int, int]] = Field(description="[[a, b], ...] port pairs")


class PortsBody(ChangeBody):
    ports: list[int] = Field(min_length=1)


class SpareBody(Body):
    endpoint: str = Field(description="endpoint id of a host's NIC")


class DecisionBody(Body):
    approve: bool


class CircuitBody(ChangeBody):
    src: str = Field(alias="from")
    dst: str = Field(alias="to")


class DrillBody(Body):
    job: str | None = Field(None, description="default: the first job with spares")
    member: str | None = Field(None, description="the member to fail; default: one at random")
    kind: Literal["gpu", "host"] = Field("gpu", description="gpu: an Xid 79 on the member's "
                                         "GPU; host: the member's host stops reporting")
