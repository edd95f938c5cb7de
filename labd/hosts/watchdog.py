"""When a GPU host is lost: the watchdog that declares a host whose heartbeats stopped for
1.5 intervals, and holds its verdicts while the daemon itself may not hear (an unsure
episode, told by ``hosts.unsure`` events).

A heartbeat costs the watchdog a few dictionary updates: it keeps hosts in the order they
were last heard, so it looks only at the few whose time may be up, never at the whole
fleet. A daemon that is itself behind does not call its hosts lost: see
:meth:`Watchdog.run`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from labd.events import EventHub
from labd.hosts.state import HostState
from labd.mqtt.client import RECONNECT_MAX_S
from labd.vocabulary import EventKind

log = logging.getLogger(__name__)

MISSED = 1.5
#: A watchdog this late (or less) was on time: timers are not exact.
LATE_NS = 5_000_000
#: How long an overdue host is given for messages already on their way in to be read.
SETTLE_S = 0.02
#: Hosts going overdue together, at least this many and :data:`MASS_SHARE` of those online,
#: look more like the daemon's (or the broker's) trouble than the hosts': they are held for
#: one more interval of evidence.
MASS_HOSTS = 8
MASS_SHARE = 0.1
#: A host held this long past its time (in intervals) is worth a ``hosts.unsure`` event;
#: shorter holds (a few ms of a broker's delivery) are ordinary.
UNSURE_AFTER = 0.1
#: How long the agents may take to reconnect once the daemon has: the longest wait of
#: their backoff, and a second to connect through a broker that is busy taking them all back.
RECONNECT_GRACE_S = RECONNECT_MAX_S + 1.0
#: How often the watchdog looks at least (a heartbeat never makes it look sooner).
TICK_S = 0.005
#: A watchdog woken this late, as a share of the shortest heartbeat interval, says the
#: daemon could not listen: an unsure episode, however short.
LAG_SHARE = 0.5
#: An online host whose time is up: its state, its last heartbeat's send time, and the
#: moment its allowance ran out (daemon clock).
Overdue = tuple["HostState", int, int]


class Watchdog:
    """The hosts' liveness and the evidence that the daemon hears them in time; the
    monitor (labd.hosts.monitor) feeds it heartbeats and statuses."""

    def __init__(self, hub: EventHub, hosts: list[str]) -> None:
        self.hub = hub
        self.hosts = {h: HostState(h) for h in hosts}
        # Online hosts with an interval, per interval, in the order their last heartbeat
        # arrived: the first of each is the first whose time can be up.
        self._watch: dict[float, OrderedDict[str, HostState]] = {}
        self.deaf_ns = 0
        """Time the watchdog could not listen (it woke this much later than it asked, in
        all): a host's allowance grows by what of it fell after its last heartbeat."""
        self.heard_ns = 0
        """The latest send time (daemon clock) of anything the daemon has read from the
        broker: the hosts' heartbeats and the bridge's own probe (:meth:`heard`). A host is
        lost only once something sent after its time was up has been read: until then the
        silence may be the daemon's or the broker's."""
        self._backlogs: list[Callable[[], int]] = []
        self.unsure: dict[str, Any] | None = None
        """The open ``hosts.unsure`` episode (hosts held, and why), if any."""
        self.lost_count = 0
        """Hosts declared lost so far (by missed heartbeats or a last will)."""
        self.probed = False
        """Whether the bridge probes its own path through the broker (:meth:`heard`):
        then silence is judged on that evidence even where no other host speaks."""
        self._ask_probe: Callable[[], None] | None = None
        self._asked_ns = 0
        """When a probe was last asked for: once for each host's time being up, not at
        every look (a broker that delivers nothing is not probed at the watchdog's tick)."""
        self._wanted_ns: int | None = None
        """The send time of evidence hosts wait for (their time was up then): heard, it
        wakes the watchdog (``_evidence``) at once, not at its next tick."""
        self._evidence = asyncio.Event()
        self._gone: deque[int] = deque()
        """When hosts were declared lost by silence lately (the mass rule's memory)."""
        self.reconnect_s = RECONNECT_GRACE_S
        """How long the hosts' agents may take to reconnect after the daemon has: part of
        the unsure episode that a loss of the broker link begins."""
        self.link_down_since: int | None = None
        """Since when the daemon's link to the broker has been down (None: up, or no
        broker)."""
        self._link_reason = ""
        self._agents_away = False
        """Whether, in the link's latest loss, the agents' connections may have gone too."""
        self._grace_until = 0
        """When the agents' time to reconnect ends (0: not reconnecting)."""
        self._awaited: set[str] = set()
        """Hosts online when the link went down and not heard since it came back: once
        none is left, the agents' time to reconnect ends early."""
        self.episode_end_ns = 0
        """When the last unsure episode that held every verdict ended: no host is declared
        lost before 1.5 intervals after it (docs/daemon.md, "When a host is lost")."""
        self._lagged: str | None = None
        self._hearing = asyncio.Event()
        self._hearing.set()
        self._offline: dict[str, int] = {}
        """Hosts that said ``offline`` (a last will, or an agent that stopped), and when:
        believed once the bridge's probe sent after it comes back, so that the wills a
        broker delivers as it shuts down change nothing."""

    def _set_status(self, state: HostState, status: str) -> None:
        raise NotImplementedError  # the monitor's: it tells the listeners

    def backlog(self, source: Callable[[], int]) -> None:
        """``source()`` says how many agent messages have arrived but are not yet handled
        (the bridge's batches): no host is declared lost while any wait."""
        self._backlogs.append(source)

    def prober(self, ask: Callable[[], None]) -> None:
        """``ask()`` has the bridge probe its path through the broker now, not at its next
        round: called when a host's time is up and nothing sent since has been read, so the
        verdict waits a broker's round trip, not a probe period (docs/benchmarks.md,
        Failover)."""
        self._ask_probe = ask

    def waiting(self) -> int:
        """Agent messages arrived but not yet handled."""
        return sum(source() for source in self._backlogs)

    # -- the broker link (the bridge tells) -----------------------------------------------
    def link_down(self, reason: str, *, agents_connected: bool = False) -> None:
        """The daemon's link to the broker is down: an unsure episode begins (or goes on),
        and the ``offline`` statuses not yet believed are dropped (a broker going away
        delivers its clients' last wills as it goes). ``agents_connected``: only the
        daemon's own connection is being remade (a takeover), the agents stayed on the
        broker: once it is back they are heard within a heartbeat interval, not their
        time to reconnect."""
        now = time.monotonic_ns()
        self._link_reason = reason
        if not agents_connected:
            self._agents_away = True
        self._offline.clear()
        self._hearing.clear()
        if self.link_down_since is None:
            self.link_down_since = now
            if not self._grace_until:
                self._awaited = {s.id for s in self.hosts.values() if s.status == "online"}
            self._grace_until = 0
        self._evidence.set()

    def link_up(self) -> None:
        """The link is back: the agents have :attr:`reconnect_s` to be heard again (less,
        once every host online before has been)."""
        if self.link_down_since is None:
            return
        self.link_down_since = None
        wait_s = self.reconnect_s
        if not self._agents_away:
            wait_s = max([h.interval_s or 1.0 for h in self.hosts.values()
                          if h.status == "online"] or [1.0]) * MISSED
        self._agents_away = False
        self._grace_until = time.monotonic_ns() + int(wait_s * 1e9)
        self._evidence.set()

    def _grace_over(self, at: int) -> None:
        self._grace_until = 0
        self._awaited.clear()
        self.episode_end_ns = max(self.episode_end_ns, at)
        self._hearing.set()

    async def hearing(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until the daemon hears its hosts again after its
        broker link was lost: every host online before has been heard, or their time to
        reconnect is over. A command sent to an agent before then can find it not yet
        back, and is lost (a job's restart would then wait for a rank that never heard of
        it). Whether it does."""
        if self.link_down_since is None and self._grace_until:
            self.causes()  # the time to reconnect may be over already
        try:
            async with asyncio.timeout(timeout):
                await self._hearing.wait()
        except TimeoutError:
            return False
        return True

    def causes(self, now: int | None = None) -> list[str]:
        """Why the daemon cannot hear its hosts now (nothing: it can); ends the agents'
        time to reconnect when it is over."""
        now = time.monotonic_ns() if now is None else now
        if self.link_down_since is not None:
            return [f"the daemon's link to the MQTT broker is down ({self._link_reason}; for "
                    f"{(now - self.link_down_since) / 1e9:.1f} s)"]
        if self._grace_until:
            if now < self._grace_until and self._awaited:
                return [f"the daemon is back on the MQTT broker and its hosts' agents have "
                        f"until {self.reconnect_s:g} s after to reconnect "
                        f"({len(self._awaited)} not heard yet)"]
            self._grace_over(min(now, self._grace_until))
        return []

    def heard(self, sent_ns: int) -> None:
        """Something sent at ``sent_ns`` (daemon clock) went through the broker and has been
        read: the bridge's probe of its own path, evidence that the daemon hears in time."""
        self.probed = True
        self._heard_at(sent_ns)

    def _heard_at(self, sent_ns: int) -> None:
        """Evidence sent at ``sent_ns`` has been read (a probe, or any host's heartbeat):
        the watchdog is woken at once if hosts wait for evidence that recent."""
        if self._offline:
            self._believe_offline(sent_ns)
        if sent_ns > self.heard_ns:
            self.heard_ns = sent_ns
            if self._wanted_ns is not None and sent_ns >= self._wanted_ns:
                self._wanted_ns = None
                self._evidence.set()
    def _said_offline(self, state: HostState) -> None:
        """An online host said ``offline``: believed once the broker is shown to deliver
        after it (the bridge's probe, asked for now), and not at all during an unsure
        episode: a broker shutting down delivers every agent's last will."""
        if self.causes():
            log.info("host %s said offline while the daemon cannot hear its hosts: left to "
                     "its heartbeats", state.id, extra={"host": state.id})
            return
        now = time.monotonic_ns()
        self._offline[state.id] = now
        if self._ask_probe is not None:
            self._asked_ns = now
            self._ask_probe()

    def _believe_offline(self, sent_ns: int) -> None:
        for host, said in list(self._offline.items()):
            if said <= sent_ns:
                del self._offline[host]
                state = self.hosts[host]
                if state.status == "online":
                    self._set_status(state, "offline")

    def _unwatch(self, state: HostState) -> None:
        if state.interval_s is not None:
            group = self._watch.get(state.interval_s)
            if group is not None:
                group.pop(state.id, None)

    def _rewatch(self, state: HostState) -> None:
        """Watch ``state`` as the most recently heard of its interval (or not at all)."""
        if state.status != "online" or not state.interval_s or state.last_beat_ns is None:
            self._unwatch(state)
            return
        group = self._watch.get(state.interval_s)
        if group is None:
            group = self._watch[state.interval_s] = OrderedDict()
        group[state.id] = state
        group.move_to_end(state.id)

    async def run(self) -> None:
        """Declare hosts lost 1.5 intervals after their last heartbeat was sent, until
        cancelled (the daemon runs it among its background loops): the timer is set for the
        earliest such moment, so a host that dies is declared lost within 1.5 intervals of
        its death, not a polling period later.

        Silence the daemon could not hear is not the host's, and a host is declared lost
        only on evidence that the daemon hears in time:

        - when this loop wakes later than it asked (a loaded machine gave the process no
          CPU, or the loop was busy), that lateness is added to every host's allowance
          until its next heartbeat; so is the delay its recent heartbeats took to arrive
          (a busy broker), up to one more allowance;
        - no host is declared while agent messages that have arrived wait to be handled;
        - a host is declared only once something sent after its time was up has been read
          (another host's heartbeat, or the bridge's probe of its own path through the
          broker, asked for then: :meth:`prober`), and the watchdog looks again as soon as
          it is; a broker that delivers late, or not at all, delays every verdict;
        - many hosts going overdue together (:data:`MASS_HOSTS`, :data:`MASS_SHARE`) wait
          for one more interval of such evidence.

        While hosts are held past their time for any of these, a ``hosts.unsure`` event
        says how many and why (``"waiting": true``), and another when the daemon is sure
        again (``"waiting": false``, with how many of them were then declared lost).
        Where nothing else is heard (a lab of one host, no probe), a host past its deadline
        gets one more look once the messages already received are read."""
        planned = time.monotonic_ns()
        while True:
            now = time.monotonic_ns()
            late = now - planned - LATE_NS
            self.deaf_ns += max(0, late)
            if self._watch and late > LAG_SHARE * min(self._watch) * 1e9:
                # Deaf for a good part of an interval: an episode of its own, over now.
                self.episode_end_ns = max(self.episode_end_ns, now)
                self._lagged = (f"the daemon's loop woke {late / 1e6:.0f} ms late (it was "
                                "busy, or its process got no CPU)")
            wake_ns = await self._look(now)
            now = time.monotonic_ns()
            wait_s = min(max((wake_ns - now) / 1e9, TICK_S), 1.0)
            planned = now + int(wait_s * 1e9)
            self._evidence.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._evidence.wait()
            planned = min(planned, time.monotonic_ns())  # woken early is not late

    def _due(self, now: int) -> tuple[list[Overdue], list[Overdue], int]:
        """Online hosts whose time is up: those past their deadline, those past their time
        but within what the daemon's deafness and the broker's delays add; and when to look
        next."""
        due: list[Overdue] = []
        held: list[Overdue] = []
        wake = now + 1_000_000_000
        for interval, group in list(self._watch.items()):
            allowance = int(MISSED * interval * 1e9)
            if self.episode_end_ns + allowance > now:
                # Nobody is due before 1.5 intervals after the last unsure episode ended.
                wake = min(wake, self.episode_end_ns + allowance)
                continue
            # In the order they were heard: a host heard later cannot be due earlier, as
            # its allowance counts from its send time plus at least its delivery.
            for state in group.values():
                heard = state.last_beat_ns or 0
                if heard + allowance > now:
                    wake = min(wake, heard + allowance)
                    break
                last = state.last_sent_ns or heard
                extra = (self.deaf_ns - state.deaf_mark_ns) + min(state.slow_ns, allowance)
                if now >= last + allowance + extra:
                    due.append((state, last, last + allowance))
                else:
                    wake = min(wake, last + allowance + extra)
                    held.append((state, last, last + allowance))
            if not group:
                del self._watch[interval]
        return due, held, wake

    async def _look(self, now: int) -> int:
        reasons = self.causes(now)
        if reasons:
            # Whatever went silent meanwhile is judged from the episode's end on.
            self.episode_end_ns = now
            self._announce(now, [], reasons, deaf=True)
            # Woken sooner by the link coming back, or by the last awaited host's heartbeat.
            return min(self._grace_until or now + 1_000_000_000, now + 1_000_000_000)
        if self._lagged is not None:
            reasons.append(self._lagged)
            self._lagged = None
        due, held, wake = self._due(now)
        if held:
            reasons.append("the daemon could not listen for a while (its loop was busy, or "
                           "its process got no CPU), or its hosts' heartbeats have been "
                           "arriving late")
        soon = now + int(TICK_S * 1e9)
        if due and (waiting := self.waiting()):
            reasons.append(f"{waiting} agent messages that have arrived are still to be read")
            held += due
            due = []
            wake = min(wake, soon)
        elif due:
            online = sum(len(g) for g in self._watch.values())
            while self._gone and self._gone[0] < now - 1_000_000_000 * MISSED:
                self._gone.popleft()
            silent = len(due) + len(self._gone)
            mass = silent >= MASS_HOSTS and silent >= MASS_SHARE * (online + len(self._gone))
            if online <= len(due) and not self.probed:
                # Nothing else to hear from: the messages already in are read first.
                await asyncio.sleep(SETTLE_S)
            else:
                sure: list[Overdue] = []
                for entry in due:
                    state, _, base = entry
                    need = base + (int((state.interval_s or 1.0) * 1e9) if mass else 0)
                    (sure if self.heard_ns >= need else held).append(entry)
                if len(sure) < len(due):
                    wake = min(wake, soon)
                    if not mass:
                        bases = [base for _, _, base in due if self.heard_ns < base]
                        self._wanted_ns = min(bases)
                        if self._ask_probe is not None and max(bases) > self._asked_ns:
                            # A probe sent now was sent after their time was up: its return
                            # is the evidence they wait for.
                            self._asked_ns = now
                            self._ask_probe()
                    reasons.append(
                        (f"{silent} hosts went silent together; " if mass else "")
                        + "nothing sent since their time was up has been read yet (the "
                          "broker may be delivering late, or not at all)")
                due = sure
            for state, last, _ in due:
                if (state.last_sent_ns or state.last_beat_ns) == last \
                        and state.status == "online":
                    self._set_status(state, "lost")
                    self._gone.append(time.monotonic_ns())
                    if self.unsure is not None:
                        self.unsure["lost"] += 1
        self._announce(time.monotonic_ns(), held, reasons)
        return wake

    def _announce(self, now: int, held: list[tuple[HostState, int, int]],
                  reasons: list[str], *, deaf: bool = False) -> None:
        """``hosts.unsure`` as an episode begins (the daemon cannot hear: ``deaf``, or it
        holds hosts past their time) and ends."""
        long = [(s, base) for s, _, base in held if s.status == "online"
                and now - base > UNSURE_AFTER * (s.interval_s or 1.0) * 1e9]
        if deaf and self.unsure is None:
            online = [s.id for s in self.hosts.values() if s.status == "online"]
            self.unsure = {"hosts": len(online), "lost": 0, "since_ns": now}
            self._publish_unsure(True, len(online), reasons, online[:10])
        elif long and self.unsure is None:
            self.unsure = {"hosts": len(long), "lost": 0, "since_ns": min(b for _, b in long)}
            self._publish_unsure(True, len(long), reasons, [s.id for s, _ in long[:10]])
        elif not held and not deaf and self.unsure is not None:
            episode, self.unsure = self.unsure, None
            self._publish_unsure(False, 0, [], [], lost=episode["lost"],
                                 held_ms=(now - episode["since_ns"]) / 1e6)
        elif long and self.unsure is not None:
            self.unsure["hosts"] = max(self.unsure["hosts"], len(long))

    def _publish_unsure(self, waiting: bool, hosts: int, reasons: list[str],
                        sample: list[str], **more: Any) -> None:
        detail = (f"{hosts} hosts may be silent, but the daemon cannot tell yet: "
                  f"{'; '.join(reasons)}; waiting for evidence before declaring any lost"
                  if waiting else "the daemon hears its hosts in time again")
        self.hub.publish(EventKind.HOSTS_UNSURE, {"waiting": waiting, "hosts": hosts,
                                          "sample": sample, "detail": detail,
                                          "source": "hosts", **more})


