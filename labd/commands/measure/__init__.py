"""``labd measure``: drills and campaigns on a lab, kept as named runs, and the runs read
back. One module per command (or pair of commands on the same thing)."""

from __future__ import annotations

import typer

from labd.commands.measure.availability import measure_availability
from labd.commands.measure.failover import measure_failover
from labd.commands.measure.reconfig import measure_reconfig
from labd.commands.measure.runs import measure_compare, measure_runs, measure_show
from labd.commands.measure.schedule import make_schedule, measure_schedule

app = typer.Typer(help="Measurements on a lab: drills and campaigns that print "
                       "their statistics.", no_args_is_help=True)
# In this order in `labd measure --help`.
app.command("failover")(measure_failover)
app.command("reconfig")(measure_reconfig)
app.command("schedule")(measure_schedule)
app.command("availability")(measure_availability)
app.command("make-schedule")(make_schedule)
app.command("runs")(measure_runs)
app.command("show")(measure_show)
app.command("compare")(measure_compare)

__all__ = ["app"]
