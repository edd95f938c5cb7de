"""The changes the UI asks the daemon for: circuits, raw pairs, breaks, a failover drill, a
latency measurement. Every change asks first (a form where there is something to type,
then yes or no); its request runs in a worker; the answer, or the daemon's refusal, is a
notification (docs/tui.md)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from textual.app import App

from labd.client.api import DaemonClient
from labd.errors import CampaignError, DaemonError
from labd.measure.campaign import ReconfigPlan, summary
from tui.render import in_the_way_text, plan_text, route_text
from tui.screens.confirm import ConfirmScreen
from tui.screens.form import FormScreen
from tui.tabs.reconfigurations import ReconfigurationsTab

Later = Callable[[], Coroutine[Any, Any, None]]


class Changes:
    """The dialogs and requests behind the app's change keys (c, p, x, d, m)."""

    def __init__(self, app: App[Any], client: DaemonClient,
                 answered: Callable[[], Awaitable[None]],
                 goto: Callable[[str], None]) -> None:
        """``answered`` is awaited after each answer (tests wait on it); ``goto`` shows a
        tab by its id."""
        self.app = app
        self.client = client
        self.answered = answered
        self.goto = goto
        self.last_notice = ""
        """The latest notification's text (tests read it)."""

    def tell(self, message: str, title: str, error: bool = False) -> None:
        self.last_notice = f"{title}: {message}"
        self.app.notify(message, title=title, severity="error" if error else "information",
                        timeout=8 if error else 5)

    def ask(self, question: str, then: Later, detail: str = "") -> None:
        """Ask (``detail``: what the change would do); on yes, run ``then()`` in a
        worker."""
        def answer(yes: bool | None) -> None:
            if yes:
                self.app.run_worker(then(), group="actions")

        self.app.push_screen(ConfirmScreen(question, detail), answer)

    def _ask_change(self, question: str, title: str, method: str, path: str,
                    body: dict[str, Any], said: Callable[[Any], str]) -> None:
        self.ask(question, lambda: self.change(title, method, path, body, said))

    async def change(self, title: str, method: str, path: str, body: dict[str, Any],
                     said: Callable[[Any], str]) -> None:
        """One change through the API; the answer (or the refusal) as a notification."""
        try:
            result = await self.client.request(method, path, body)
        except DaemonError as exc:
            self.tell(str(exc), f"{title}: refused", error=True)
        else:
            self.tell(said(result), title)
        await self.answered()

    def circuit(self, endpoints: Sequence[str] = ()) -> None:
        """A circuit between two endpoints, on every switch it crosses; ``endpoints`` (the
        lab's) are offered as they are typed. Before asking, the daemon's plan: the
        switches and ports it would cross-connect, or why it cannot and what is in the
        way (then nothing is asked)."""
        def typed(answer: dict[str, str] | None) -> None:
            if answer is None:
                return
            self.app.run_worker(self._plan_then_ask(answer["src"], answer["dst"]),
                                group="actions")

        example = list(endpoints[:2]) or ["h0.nic0", "h1.nic0"]
        known = {"src": endpoints, "dst": endpoints} if endpoints else None
        self.app.push_screen(FormScreen("Make a circuit", [
            ("src", f"From endpoint (e.g. {example[0]})", ""),
            ("dst", f"To endpoint (e.g. {example[-1]})", "")], choices=known), typed)

    async def _plan_then_ask(self, src: str, dst: str) -> None:
        try:
            plan = await self.client.get("/v1/circuits/plan", **{"from": src, "to": dst})
        except DaemonError as exc:
            self.tell(str(exc), "circuit not planned", error=True)
        else:
            if plan.get("possible"):
                self.ask(f"Make the circuit {src} → {dst} (on every switch it crosses)?",
                         lambda: self.change(
                             "circuit made", "POST", "/v1/circuits", {"from": src, "to": dst},
                             lambda r: f"{src} → {dst} via {route_text(r['route'])}"),
                         detail=plan_text(plan))
            else:
                self.tell(in_the_way_text(plan), f"circuit {src} → {dst} cannot be made",
                          error=True)
        await self.answered()

    def pair(self, at: tuple[str, int] | None) -> None:
        """A raw pair on one switch; ``at``, the port under the cursor, fills in the form."""
        def typed(answer: dict[str, str] | None) -> None:
            if answer is None:
                return
            try:
                a, b = int(answer["a"]), int(answer["b"])
            except ValueError:
                self.tell("ports are numbers", "raw pair not made", error=True)
                return
            self.pair_here(answer["switch"], a, b)

        self.app.push_screen(FormScreen("Connect a raw pair on one switch", [
            ("switch", "Switch", at[0] if at else ""),
            ("a", "Port", str(at[1]) if at else ""), ("b", "Other port", "")]), typed)

    def pair_here(self, switch: str, a: int, b: int) -> None:
        """The raw pair a↔b on ``switch``, after asking (the matrix's cursor names both)."""
        self._ask_change(
            f"Connect {switch} port {a} to port {b} (a raw pair, no endpoints)?",
            "pair made", "POST", f"/v1/switches/{switch}/connections",
            {"pairs": [[a, b]]}, lambda r: f"{switch} {a}↔{b}: {r['outcome']}")

    def break_port(self, switch: str, port: int, circuit: str | None, partner: str) -> None:
        """Break the circuit through the port, else its raw pair with ``partner``."""
        if circuit:
            src, dst = circuit.split(" → ")
            self._ask_change(
                f"Break the circuit {circuit} (on every switch it crosses)?",
                "circuit broken", "POST", "/v1/circuits/disconnect", {"from": src, "to": dst},
                lambda r: f"{circuit}: was via {route_text(r['route'])}")
        elif partner:
            self._ask_change(
                f"Disconnect {switch} port {port} from port {partner}?",
                "pair broken", "POST", f"/v1/switches/{switch}/disconnect", {"ports": [port]},
                lambda r: f"{switch} {port}↔{partner}: {r['outcome']}")
        else:
            self.tell(f"{switch} port {port} is in no circuit", "nothing to break")

    def drill(self) -> None:
        self.ask("Run a failover drill: a member GPU of the first job with spares fails "
                 "(Xid 79), the daemon swaps a spare in, then the member is repaired?",
                 self._drill)

    async def _drill(self) -> None:
        try:
            await self.client.post("/v1/drills/failover", {"kind": "gpu"})
        except DaemonError as exc:
            self.tell(str(exc), "drill not started", error=True)
        else:
            self.goto("failover")
        await self.answered()

    def drill_said(self, data: dict[str, Any]) -> None:
        """A ``drill`` event: how the drill goes, as notifications."""
        state = data.get("state")
        if state == "failed":
            self.tell(str(data.get("detail")), "drill failed", error=True)
        elif state in ("recovered", "ended"):
            self.tell(f"job {data['job']}: {data.get('member')} → {data.get('outcome')}",
                      "drill")
        elif state == "done":
            self.tell(f"{data.get('member')} repaired and returned as a spare", "drill done")

    def measure(self, at: tuple[str, int] | None, shown_on: ReconfigurationsTab) -> None:
        """A latency measurement on a switch's free ports (``at``, the port under the
        cursor, fills in the switch), shown on the Reconfigurations tab."""
        def typed(answer: dict[str, str] | None) -> None:
            if answer is None:
                return
            try:
                plan = ReconfigPlan(answer["switch"], answer["pattern"],
                                    int(answer["rounds"]), int(answer["k"]))
                plan.check()
            except (ValueError, CampaignError) as exc:
                self.tell(str(exc), "measurement not started", error=True)
                return
            # An app worker: when the app closes it waits for the measurement to put its
            # switch back (LabApp.on_unmount).
            self.app.run_worker(self._measure(plan, shown_on), group="measure", exclusive=True)

        self.app.push_screen(FormScreen("Measure reconfiguration latency on free ports", [
            ("switch", "Switch", at[0] if at else ""),
            ("pattern", "Pattern: toggle, random, permutation or sweep", "toggle"),
            ("rounds", "Rounds: reconfigurations per batch size", "20"),
            ("k", "k: pairs per batch (random)", "1")]), typed)

    async def _measure(self, plan: ReconfigPlan, tab: ReconfigurationsTab) -> None:
        self.goto(str(tab.id))
        rows: list[dict[str, Any]] = []
        stopped = None
        try:
            async for row in tab.measure(self.client, plan):
                rows.append(row)
        except (DaemonError, CampaignError) as exc:
            stopped = str(exc)
            self.tell(stopped, "measurement stopped", error=True)
        # The result stays in the tab's panel; the notification only says it is there.
        device = [r for r in summary(rows) if r["span"] == "device"]
        headline = tab.measured(plan, rows, stopped)
        self.tell(", ".join(f"k={r['k']}: device p50 {r['p50']:.2f} ms, p99 "
                            f"{r['p99']:.2f} ms" for r in device) or "no timed rows",
                  headline)
        await self.answered()
