"""How the tabs show things: cells and lines of text shared by the tables and dialogs."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rich.text import Text

from labd.vocabulary import span_ms

BARS = "▁▂▃▄▅▆▇█"
#: Light below this is dark; within 20 dB above it, weak (the port map and the matrix).
POWER_THRESHOLD_DBM = -30.0


def sparkline(values: list[float]) -> str:
    """The values as bars, scaled between their minimum and maximum."""
    if not values:
        return ""
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(BARS[min(len(BARS) - 1, int((v - low) / span * len(BARS)))] for v in values)


def power_text(dbm: float | None, threshold: float = POWER_THRESHOLD_DBM) -> Text:
    """Optical power, coloured by level: light, weak light, dark."""
    if dbm is None:
        return Text("-", style="dim")
    style = "green" if dbm >= threshold + 20 else "yellow" if dbm >= threshold else "dim red"
    return Text(f"{dbm:7.2f}", style=style)


def port_cell(column: str, value: Any) -> str | Text:
    """One port-map cell as shown: plain strings where there is nothing to colour (768
    rows add up), colour where it says something."""
    if column == "power":
        return power_text(value)
    if column in ("partner", "circuit"):
        return Text(value, style="bold cyan") if value else ""
    if column == "state" and value not in ("enabled", "unknown"):
        return Text(value, style="red" if value == "failed" else "dim")
    return str(value)


def draw_path(ingress: int, egress: int | None, elements: list[list[Any]]) -> Text:
    """A mesh path as the light takes it: ``1 ─[0 ═]─[5 ╳]─[9 ═]─ 6``."""
    text = Text(f"{ingress} ")
    for element, state in elements:
        text.append("─[", style="dim")
        text.append(f"{element} {'═' if state == 'bar' else '╳'}",
                    style="cyan" if state == "bar" else "magenta")
        text.append("]", style="dim")
    text.append(f"─ {egress if egress is not None else '?'}")
    return text


def route_text(route: dict[str, Any]) -> str:
    """A circuit's route as its hops, switch by switch: ``ocs1 1→9, ocs2 3→4``."""
    return ", ".join(f"{h['switch']} {h['ingress']}→{h['egress']}"
                     for h in route["hops"]) or "a direct fibre"


def reconfiguration_cells(row: dict[str, Any]) -> tuple[str | Text, ...]:
    """A reconfiguration as the table shows it: id, switch, cause, outcome, pairs, and its
    device, light and total times in ms."""
    def span(a: str, b: str) -> str:
        value = span_ms(row, a, b)
        return "-" if value is None else f"{value:.2f}"

    outcome = str(row.get("outcome"))
    pairs = len(row.get("connected", [])) + len(row.get("disconnected", []))
    return (str(row.get("id")), str(row.get("switch")), str(row.get("cause")),
            Text(outcome, style="green" if outcome == "ok" else "bold red"), str(pairs),
            span("dispatched", "acknowledged"), span("dispatched", "light"),
            span("requested", "done"))


def local_time(iso: str) -> str:
    """A wall-clock time from the API (ISO 8601, UTC) in the terminal's time zone."""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return iso


def plan_text(plan: dict[str, Any]) -> str:
    """What a circuit's plan (``GET /v1/circuits/plan``) would cross-connect, switch by
    switch, and that it displaces nothing (a circuit takes free ports only)."""
    hops = plan["route"]["hops"] if plan.get("route") else []
    if not hops:
        return "A direct fibre: no switch is changed."
    width = max(len(h["switch"]) for h in hops)
    lines = ["Cross-connects:"] + [
        f"  {h['switch']:<{width}}  port {h['ingress']} → port {h['egress']}" for h in hops]
    lines.append("Displaces no circuit: every port on the way is free.")
    return "\n".join(lines)


def in_the_way_text(plan: dict[str, Any]) -> str:
    """Why a circuit cannot be made now, and what holds the ports on its way."""
    held = []
    for h in plan.get("in_the_way", []):
        circuit = h.get("circuit")
        owner = (f"circuit {circuit['from']} → {circuit['to']}" if circuit
                 else f"raw pair {h['port']}↔{h['partner']}")
        held.append(f"{h['switch']}:{h['port']} ({owner})")
    reason = str(plan.get("reason") or "it cannot be made now")
    return f"{reason}; in the way: {', '.join(held)}" if held else reason
