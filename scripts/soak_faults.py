"""The soak's long faults (scripts/soak.py), each run as a task beside the quick steps:

- a failover drill on the failover lab: a member's GPU fails (Xid 79) or its host dies,
  through the emulators' control endpoint; the daemon recovers the job with a spare; the
  drill then repairs the host and gives the member back as a spare;
- incidents, one at a time, at random intervals: the broker restarted (SIGTERM or SIGKILL,
  then an outage of 1, 5 or 20 s: only where the soak owns the broker), or the leader of a
  lab changed (SIGKILL, SIGTERM, or SIGSTOP past the lease's TTL then SIGCONT: only under
  --ha), then a new standby started.

Each keeps a window of when it ran, so that a host loss the daemons report can be told
caused (a host a drill killed) or false, and a false one set beside the incident it came in.
"""

from __future__ import annotations

import asyncio
import collections
import math
import random
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from soak_lab import LEASE_TTL_S, READY_S, Process, Site, scaled
from soak_steps import HostLoss, Soak

from labd.client.control import Backdoor
from labd.errors import BackdoorError
from labd.lab.loader import Lab
from labd.mqtt.private import Mosquitto

#: How long after a window's end a loss still counts as within it: the daemons hear late.
GRACE_S = 10.0
#: How long a recovery (a failover, hosts back after the broker) may take before the soak
#: says it did not happen.
RECOVERY_S = 60.0


@dataclass
class Window:
    what: str
    start: float
    end: float = math.inf
    host: str = ""
    """A drill's killed host (its loss is caused); empty for an incident."""

    def holds(self, at: float) -> bool:
        return self.start <= at <= self.end + GRACE_S


@dataclass
class Incident:
    what: str
    outcome: str
    at: float = field(default_factory=time.time)
    """When it began (time.time())."""

    def __str__(self) -> str:
        return f"{time.strftime('%H:%M:%S', time.gmtime(self.at))} {self.what}: {self.outcome}"


@dataclass
class Faults:
    """Drills and incidents, and what each found."""

    soak: Soak
    hosts_lab: Lab
    rng: random.Random
    broker: Mosquitto | None
    outages: list[float]
    ha_sites: list[Site]
    job: str
    windows: list[Window] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)
    drills: collections.Counter[str] = field(default_factory=collections.Counter)
    drilling: asyncio.Task[None] | None = None
    odd_drills: list[str] = field(default_factory=list)
    """Each drill that did not end recovered (or without a spare): when (UTC), what."""
    drilled: set[str] = field(default_factory=set)
    """The hosts a drill has failed (a GPU) or killed, until it has repaired them."""
    backdoor: Backdoor | None = None
    say: Callable[[str], None] = print
    """Where progress lines go (the soak's console)."""

    def __post_init__(self) -> None:
        self.backdoor = Backdoor(self.soak.hosts.control)
        # The incidents' own generator, drawn before any step: the same seed gives the same
        # incidents in the same order, however many quick steps the machine runs between.
        self.irng = random.Random(self.rng.random())

    async def close(self) -> None:
        if self.drilling is not None:
            self.drilling.cancel()
            await asyncio.gather(self.drilling, return_exceptions=True)
        if self.backdoor is not None:
            await self.backdoor.close()

    # -- failover drills ---------------------------------------------------------------------
    def drill(self) -> None:
        """Start a drill unless one runs (then it is counted as busy, as the daemon's own
        drill service answers 409)."""
        if self.drilling is not None and not self.drilling.done():
            self.soak.steps["drill busy"] += 1
            return
        kind = self.rng.choice(["gpu", "host"])
        self.soak.steps[f"drill {kind}"] += 1
        self.drilling = asyncio.create_task(self._drill(kind), name=f"drill-{kind}")

    def _cut_off(self, since: float) -> str | None:
        """A leader change of the hosts' lab that began after ``since`` and ended more than
        :data:`GRACE_S` ago, if any: a recovery still unrecorded by then has been dropped."""
        for w in self.windows:
            if (not w.host and w.what.endswith(f"({self.soak.hosts.lab})")
                    and w.start >= since and w.end + GRACE_S < time.time()):
                return w.what
        return None

    async def drills_over(self, within_s: float) -> bool:
        """Wait for the last drill; then whether every host is back online and healthy."""
        if self.drilling is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self.drilling), within_s)
            except TimeoutError:
                return False
        return await self.hosts_ready()

    async def hosts_ready(self, since_ns: int = 0) -> bool:
        """Every host online with every GPU healthy (and, with ``since_ns``, heard from
        since then: CLOCK_MONOTONIC, which the daemons on this machine share). With
        ``since_ns``, a host that a drill has down is left out: the incident is not its
        cause."""
        found = await self.soak.hosts.get_json("/v1/hosts")
        down = self.drilled if since_ns else set()
        return isinstance(found, list) and len(found) == len(self.hosts_lab.host) and all(
            h["status"] == "online" and all(g["health"] == "healthy" for g in h["gpus"])
            and (h["last_beat_ns"] or 0) > since_ns for h in found if h["id"] not in down)

    async def until_hosts_ready(self, within_s: float, since_ns: int = 0) -> float | None:
        """Seconds until every host is ready (polling the leader), None past ``within_s``."""
        within_s = scaled(within_s)
        began = time.monotonic()
        while time.monotonic() - began < within_s:
            if await self.hosts_ready(since_ns):
                return time.monotonic() - began
            await asyncio.sleep(0.1)  # polling an outcome with a deadline
        return None

    async def _last_failover(self) -> int:
        found = await self.soak.hosts.get_json("/v1/failovers", params={"limit": 1})
        return int(found[0]["id"]) if found else 0

    async def _drill(self, kind: str) -> None:
        site, backdoor = self.soak.hosts, self.backdoor
        assert backdoor is not None
        job = await site.get_json(f"/v1/jobs/{self.job}")
        if job is None or job.get("status") != "running":
            self.drills[f"not started: job {job and job.get('status')}"] += 1
            return
        member = self.rng.choice(job["members"])
        where = self.hosts_lab.placement(member)
        assert where is not None
        host, gpu = where[0].id, where[1]
        before = await self._last_failover()
        began = time.time()
        window: Window | None = None
        outcome = "never recorded"
        self.drilled.add(host)
        try:
            if kind == "gpu":
                await backdoor.fail_gpu(host, gpu, "xid79")
            else:
                window = Window(f"drill host {host}", time.time(), host=host)
                self.windows.append(window)
                await backdoor.kill_host(host)
            self.soak.faults[f"drill {kind}"] += 1
            end = time.monotonic() + scaled(RECOVERY_S)
            while time.monotonic() < end:
                found = await site.get_json("/v1/failovers", params={"job": self.job})
                mine = [f for f in found or [] if f["id"] > before and f["member"] == member]
                if mine and mine[0]["outcome"] != "in-progress":
                    outcome = str(mine[0]["outcome"])
                    break
                cut = self._cut_off(began)
                if cut is not None:  # the new leader has had its time: no need to wait more
                    outcome = (f"{'left in-progress' if mine else 'never recorded'} after "
                               f"a {cut} during the recovery")
                    break
                await asyncio.sleep(0.2)  # polling an outcome with a deadline
            else:
                outcome += f" within {scaled(RECOVERY_S):g} s"
        except (BackdoorError, httpx.HTTPError) as exc:
            outcome = f"broke: {type(exc).__name__}: {str(exc)[:80]}"
        finally:
            try:
                await (backdoor.heal(host, gpu) if kind == "gpu" else backdoor.revive_host(host))
                if await self.until_hosts_ready(RECOVERY_S) is None:
                    outcome += ", hosts not back"
                job = await site.get_json(f"/v1/jobs/{self.job}")
                if job is not None and member not in job["members"] \
                        and member not in job["spares"]:
                    returned = await site.call("POST", f"/v1/jobs/{self.job}/spares",
                                               json={"endpoint": member})
                    if returned is None or returned.status_code != 200:
                        outcome += ", spare not returned"
            finally:
                self.drilled.discard(host)
                if window is not None:
                    window.end = time.time()
        self.drills[f"{kind} {outcome}"] += 1
        if outcome not in ("recovered", "no-spare"):
            self.odd_drills.append(f"{time.strftime('%H:%M:%S', time.gmtime(began))} {kind} "
                                   f"drill on {member} ({host}): {outcome}")
            self.say(f"  drill: {self.odd_drills[-1]}")

    # -- incidents ---------------------------------------------------------------------------
    def said(self, incident: Incident) -> None:
        """Kept for the summary, and said now: a run cut short still tells what it did."""
        self.incidents.append(incident)
        self.say(f"  incident: {incident}")

    def kinds(self) -> list[str]:
        return (["broker"] if self.broker is not None else []) + \
            (["leader"] if self.ha_sites else [])

    async def run(self, stop: asyncio.Event, gap_s: tuple[float, float]) -> None:
        """Incidents one after another, a random gap between them, until ``stop``; the
        kinds take turns, so that a short soak has each."""
        kinds = self.kinds()
        turn = 0
        while kinds and not stop.is_set():
            try:  # the gap is a fault parameter; the stop ends it early
                await asyncio.wait_for(stop.wait(), self.irng.uniform(*gap_s))
                return
            except TimeoutError:
                pass
            turn += 1
            if kinds[turn % len(kinds)] == "broker":
                await self.broker_restart()
            else:
                await self.leader_change()

    async def broker_restart(self) -> None:
        """Stop the broker (SIGTERM: it says goodbye, delivering every client's last will;
        SIGKILL: a crash), leave it down for the outage, start it again on its port; then
        wait for every daemon to be back on it and every host heard again."""
        assert self.broker is not None
        sig = self.irng.choice([signal.SIGTERM, signal.SIGKILL])
        outage = self.irng.choice(self.outages)
        what = f"broker {sig.name} {outage:g} s"
        window = Window(what, time.time())
        self.windows.append(window)
        self.soak.faults[what] += 1
        await self.broker.stop(sig)
        await asyncio.sleep(outage)  # the outage: a fault parameter, not a wait on anything
        await self.broker.start()
        back_ns = time.monotonic_ns()
        began = time.monotonic()
        connected = await self.until_connected(RECOVERY_S)
        hosts = await self.until_hosts_ready(RECOVERY_S, since_ns=back_ns)
        window.end = time.time()
        took = time.monotonic() - began
        self.said(Incident(what, at=window.start, outcome=(
            f"daemons reconnected {'in time' if connected else 'NOT within the deadline'}, "
            + (f"hosts heard again {took:.2f} s after the restart" if hosts is not None
               else f"hosts NOT back within {RECOVERY_S:g} s"))))

    async def until_connected(self, within_s: float) -> bool:
        """Every live daemon says it is on the broker again (``labd_mqtt_connected``)."""
        end = time.monotonic() + scaled(within_s)
        while time.monotonic() < end:
            if all([await self._connected(site, proc) for site in self.soak_sites()
                    for proc in site.daemons if proc.alive]):
                return True
            await asyncio.sleep(0.1)  # polling an outcome with a deadline
        return False

    def soak_sites(self) -> list[Site]:
        return [self.soak.demo, self.soak.hosts]

    @staticmethod
    async def _connected(site: Site, proc: Process) -> bool:
        try:
            text = (await site.http.get(proc.url + "/metrics", timeout=2)).text
        except httpx.HTTPError:
            return False
        return any(line.startswith("labd_mqtt_connected") and line.endswith(" 1.0")
                   for line in text.splitlines())

    async def leader_change(self) -> None:
        """Make a lab's leader go (SIGKILL; SIGTERM, when it gives the lease up; SIGSTOP
        past the TTL, then SIGCONT, when it should find it lost the lead and exit), wait
        for the standby to lead, then start a new standby."""
        site = self.irng.choice(self.ha_sites)
        old = await site.find_leader()
        if old is None:
            self.said(Incident(f"leader change on {site.lab}",
                                           "skipped: no daemon leads"))
            return
        how = self.irng.choice(["SIGKILL", "SIGTERM", "SIGSTOP"])
        what = f"leader {how} ({site.lab})"
        window = Window(what, time.time())
        self.windows.append(window)
        self.soak.faults[what] += 1
        standbys = [p for p in site.daemons if p.alive and p is not old]
        began = time.monotonic()
        pause = LEASE_TTL_S + self.irng.uniform(0.5, 3.0)
        old.process.send_signal(getattr(signal, how))
        led = await self.until_led(site, standbys, LEASE_TTL_S + 10)
        took = time.monotonic() - began
        notes = [f"{led.name} led {took:.2f} s after the signal" if led is not None
                 else "NO standby led within TTL + 10 s"]
        if how == "SIGSTOP":
            await asyncio.sleep(max(0.0, pause - took))  # the pause: a fault parameter
            old.process.send_signal(signal.SIGCONT)
        if how != "SIGKILL":
            try:
                async with asyncio.timeout(scaled(30)):
                    await old.process.wait()
            except TimeoutError:
                notes.append(f"{old.name} still running 30 s after {how}: killed")
                old.process.kill()
                await old.process.wait()
        old.ended = f"{how} by the soak, exit status {old.process.returncode}"
        notes.append(f"{old.name} exited with status {old.process.returncode}")
        await self._replace(site, notes)
        window.end = time.time()
        self.said(Incident(what, "; ".join(notes), window.start))

    async def _replace(self, site: Site, notes: list[str]) -> None:
        try:
            new = await site.start_daemon()
            await site.until_role(new, "standby", READY_S)
            notes.append(f"{new.name} stands by")
        except (RuntimeError, TimeoutError) as exc:
            notes.append(f"the new standby did not stand by: {str(exc)[:300]}")

    async def until_led(self, site: Site, standbys: list[Process], within_s: float
                        ) -> Process | None:
        """The standby that leads (polling their health), or None past ``within_s``."""
        end = time.monotonic() + scaled(within_s)
        while time.monotonic() < end:
            for proc in standbys:
                if await site.role(proc, timeout=1.0) == "leader":
                    site.leading = proc
                    return proc
            await asyncio.sleep(0.05)  # polling an outcome with a deadline
        return None

    async def not_recovered(self) -> list[str]:
        """The recorded failovers that did not end ``recovered``: what each says."""
        found: list[dict[str, Any]] = await self.soak.hosts.get_json(
            "/v1/failovers", params={"limit": 10_000}) or []
        return [f"failover {f['id']} at {str(f.get('wall_time'))[11:19]} {f['member']} "
                f"({f['trigger']}, {f.get('reasons')}): {f['outcome']}, last stage "
                f"{_last_stage(f.get('stages'))} {str(f.get('detail') or '')[:200]}"
                for f in reversed(found) if f["outcome"] != "recovered"]

    # -- the verdict on host losses ----------------------------------------------------------
    def caused(self, loss: HostLoss) -> bool:
        return any(w.host == loss.host and w.holds(loss.at) for w in self.windows if w.host)

    def during(self, loss: HostLoss) -> str:
        """The incident a false loss came in, if any (the latest to begin before it: one
        incident's grace can reach into the next)."""
        for w in reversed(self.windows):
            if not w.host and w.holds(loss.at):
                return w.what
        return "no incident"

    async def failover_losses(self) -> list[HostLoss]:
        """Every recorded failover with trigger ``host-lost`` (from the store, through the
        leader: every daemon's record of the lab)."""
        found: list[dict[str, Any]] = await self.soak.hosts.get_json(
            "/v1/failovers", params={"limit": 10_000}) or []
        losses = []
        for f in found:
            if f.get("trigger") != "host-lost":
                continue
            where = self.hosts_lab.placement(f["member"])
            host = f.get("host") or (where[0].id if where else "?")
            losses.append(HostLoss(self.soak.hosts.lab, str(host), _wall(f.get("wall_time")),
                                   f"failover {f['id']} {f['member']} {f['outcome']}: "
                                   f"{str(f.get('reasons') or '')[:120]}"))
        return losses


def _last_stage(stages: Any) -> str:
    """The stage a recovery reached last (the latest of its timestamps)."""
    if not isinstance(stages, dict) or not stages:
        return "none"
    return str(max(stages.items(), key=lambda item: item[1] or 0)[0])


def _wall(iso: Any) -> float:
    """A failover's wall time as time.time() gives it (SQLite gives it back without a
    zone: it was written in UTC)."""
    try:
        when = datetime.fromisoformat(str(iso))
    except ValueError:
        return 0.0
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
