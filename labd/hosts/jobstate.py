"""A job as the daemon follows it (members, spares, epoch and run, progress), a member's
failure, and the timeline of its recovery: what labd.hosts.jobs and labd.hosts.recovery
share."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from labd.lab.loader import JobEntry
from labd.store.pools import keep_pool
from labd.vocabulary import STAGES

SendToHost = Callable[[str, dict[str, Any]], Awaitable[None]]


def since_failure_ms(stages: dict[str, int | None]) -> dict[str, float]:
    """Each reached stage, in ms after the failure (after detection where the failure's
    own time is unknown)."""
    first = stages.get("failure") or stages.get("detected")
    return {k: round((v - first) / 1e6, 3) for k in STAGES
            if (v := stages.get(k)) is not None and first}


@dataclass
class Failure:
    job: str
    member: str
    host: str
    gpu: int | None
    trigger: str  # gpu-failed, host-lost
    reasons: list[str]
    failure_ns: int | None
    reported_ns: int | None
    detected_ns: int
    taken: Timeline | None = None
    """The record of a recovery its daemon stopped in (a leader change), to be carried on
    under the same record rather than begun again."""


@dataclass
class Timeline:
    job: str
    trigger: str
    member: str
    host: str
    gpu: int | None
    reasons: list[str]
    stages: dict[str, int | None]
    id: int | None = None
    outcome: str = "in-progress"
    detail: str = ""
    plan: dict[str, Any] | None = None
    rejected: dict[str, str] = field(default_factory=dict)
    epoch: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "job": self.job, "trigger": self.trigger, "member": self.member,
                "host": self.host, "gpu": self.gpu, "reasons": self.reasons,
                "outcome": self.outcome, "detail": self.detail, "plan": self.plan,
                "rejected": self.rejected, "epoch": self.epoch,
                "stages": {k: self.stages.get(k) for k in STAGES},
                "since_failure_ms": since_failure_ms(self.stages)}

    def row_detail(self) -> dict[str, Any]:
        data = self.as_dict()
        return {k: data[k] for k in ("trigger", "member", "host", "gpu", "reasons", "detail",
                                     "plan", "rejected", "epoch")}


@dataclass
class JobState:
    entry: JobEntry
    members: list[str]
    spares: list[str]
    epoch: int = 0
    run: str = ""
    """Names the current start alone (the agents echo it): a new leader may send again an
    epoch its predecessor sent but did not keep."""
    status: str = "idle"  # idle, running, recovering, degraded, stopped
    progress: dict[int, dict[str, int]] = field(default_factory=dict)
    """Rank → progress → when (daemon clock), for the current epoch."""
    queue: asyncio.Queue[Failure] = field(default_factory=asyncio.Queue)
    decision: asyncio.Future[bool] | None = None
    pending: Timeline | None = None
    incoming: str | None = None
    """The spare a running recovery is swapping in: its failures count as the job's."""
    failed: set[str] = field(default_factory=set)
    """Members known failed that no recovery replaced: further reports of them are not new
    failures; a spare returned to the pool retries them."""
    healing: bool = False
    """A look at whether the degraded job can run again is queued."""

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.entry.id, "topology": self.entry.topology,
                "members": self.members, "spares": self.spares, "epoch": self.epoch,
                "status": self.status, "recovery": self.entry.recovery,
                "links": [list(link) for link in self.entry.links(self.members)],
                "awaiting_decision": self.pending.id if self.pending else None}

    def new_run(self) -> None:
        """A start or restart: the next epoch, under a name no earlier start had."""
        self.epoch += 1
        self.run = secrets.token_hex(4)
        self.progress = {}



def keep(state: JobState) -> Callable[..., None]:
    """The store write that keeps the job's members and spares as they are now."""
    return keep_pool(state.entry.id, state.members, state.spares, state.status, state.epoch)


def cut_off(job: str, trigger: str | None, stages: dict[str, Any],
            detail: dict[str, Any] | None, row: int) -> Timeline:
    """The timeline of a recovery kept without an outcome (its daemon stopped in it), as
    its record says."""
    said = detail or {}
    gpu = said.get("gpu")
    epoch = said.get("epoch")
    timeline = Timeline(job, trigger or str(said.get("trigger") or "gpu-failed"),
                        str(said.get("member") or ""), str(said.get("host") or ""),
                        gpu if type(gpu) is int else None,
                        [str(r) for r in said.get("reasons") or []],
                        {k: v for k, v in (stages or {}).items()
                         if k in STAGES and type(v) is int}, id=row,
                        plan=said.get("plan") if isinstance(said.get("plan"), dict) else None,
                        epoch=epoch if type(epoch) is int else None)
    return timeline
