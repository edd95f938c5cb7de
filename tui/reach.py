"""What the UI can do in this lab: the banner shown while the daemon is out of reach, and
the changes this lab cannot take, each with the reason the UI gives for it.

A key that cannot work here is shown dimmed and says why when pressed, rather than asking
for confirmation and then relaying the daemon's refusal (docs/tui.md, "Keys")."""

from __future__ import annotations

import time

from textual.widgets import Static

from labd.client.api import DaemonClient
from labd.errors import DaemonError

#: The keys that change something, by their action: none works without the daemon.
CHANGES = {"circuit": "c", "pair": "p", "break": "x", "measure": "m", "drill": "d"}


class Unreachable(Static):
    """A banner over the tabs while the daemon is out of reach: its URL, why, and what to
    do; hidden while the UI follows the daemon."""

    DEFAULT_CSS = """
    Unreachable {
        display: none;
        height: auto;
        padding: 0 1;
        background: $error 30%;
        color: $text;
    }
    Unreachable.shown {
        display: block;
    }
    """

    def __init__(self) -> None:
        super().__init__("", id="unreachable", markup=False)
        self.text = ""
        """What the banner says (tests read it)."""

    def tell(self, url: str, why: str, since: float | None) -> None:
        """The daemon at ``url`` cannot be reached (``why``); ``since``: when it was lost,
        or None where it was never reached."""
        if why.startswith("event stream ") and ": " in why:
            why = why.split(": ", 1)[1]  # the URL is said already
        if since is None:
            self.text = (f"Daemon not reachable at {url}: {why}. Start it (labd run LAB, or "
                         f"labd demo --serve) or give its URL: labd tui URL. Retrying; r "
                         f"retries now.")
        else:
            at = time.strftime("%H:%M:%S", time.localtime(since))
            self.text = (f"Daemon not reachable at {url} since {at}: {why}. The last "
                         f"picture is kept, dimmed; retrying (r retries now).")
        self.update(self.text)
        self.add_class("shown")

    def clear(self) -> None:
        self.text = ""
        self.update("")
        self.remove_class("shown")


async def unable(client: DaemonClient, endpoints: list[str], switches: list[str]
                 ) -> dict[str, str]:
    """The changes this lab cannot take, by action, each with why: asked of the daemon
    (``GET /v1/drills``, its endpoints and switches), never learnt from a refusal."""
    out: dict[str, str] = {}
    try:
        drills = await client.get("/v1/drills")
    except DaemonError:
        drills = None  # a daemon from before the read: the drill's own answer will say
    failover = (drills or {}).get("failover") or {}
    if drills is not None and not failover.get("available", True):
        out["drill"] = str(failover.get("reason") or "this daemon runs no failover drills")
    if not endpoints:
        out["circuit"] = "this lab declares no endpoints to connect"
    if not switches:
        out.update(dict.fromkeys(("pair", "break", "measure"), "this lab has no switch"))
    return out
