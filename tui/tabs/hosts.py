"""The Hosts tab: each GPU host's status, GPUs, NIC links and the jobs it serves."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import DataTable

from tui.tabs.pane import Pane

HEALTH_STYLES = {"healthy": "green", "degraded": "yellow", "failed": "bold red"}


def roles(nics: dict[str, bool], jobs: list[dict[str, Any]]) -> str:
    """The jobs (and ranks) a host's NICs serve, and the pools they are spares in."""
    found = []
    for job in jobs:
        members = job.get("members", [])
        found += [f"{job['id']} ({members.index(n)})" for n in nics if n in members]
        found += [f"spare for {job['id']}" for n in nics if n in job.get("spares", [])]
    return ", ".join(found) or "-"


class HostsTab(Pane):
    """The hosts and jobs of the daemon's latest word on them."""

    HELP = ("Each GPU host: status (lost hosts in red), its GPUs' health (● green healthy, "
            "yellow degraded, red failed), NIC links, and the jobs (rank) it serves or is a "
            "spare for. d runs a failover drill (emulated hosts).")
    KEYS_AT = "#hosttable"

    def __init__(self) -> None:
        super().__init__("2 Hosts", "hosts")
        self.hosts: list[dict[str, Any]] = []
        self.jobs: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        yield DataTable(id="hosttable", cursor_type="row")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns(
            "host", "status", "GPUs", "NIC links", "jobs (rank) / spare")

    def show(self, hosts: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
        self.hosts, self.jobs = hosts, jobs
        self.changed()

    def show_hosts(self, hosts: list[dict[str, Any]]) -> None:
        self.hosts = hosts
        self.changed()

    def show_job(self, job: dict[str, Any]) -> None:
        self.jobs = [job if j.get("id") == job.get("id") else j for j in self.jobs]
        self.changed()

    def draw(self) -> None:
        table = self.query_one(DataTable)
        table.clear()
        for host in self.hosts:
            gpus = Text()
            for gpu in host.get("gpus", []):
                gpus.append("● ", style=HEALTH_STYLES.get(gpu.get("health"), "dim"))
            links = " ".join(f"{n}:{'up' if up else 'down'}"
                             for n, up in sorted(host.get("nics", {}).items()))
            status = host.get("status", "unknown")
            table.add_row(host["id"], Text(status, style="green" if status == "online"
                                           else "bold red"), gpus, links,
                          roles(host.get("nics", {}), self.jobs), key=host["id"])
