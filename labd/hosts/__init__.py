"""GPU hosts and the jobs on them: what the agents report (``monitor``, each host's
``state``), when a host is lost (``watchdog``), the jobs (``jobs``, their ``jobstate``),
the commands to the agents (``commands``), choosing a spare (``spares``), recovering a job
when a member fails (``recovery``), and the agents' own MQTT feed (``feed``). The messages
on the wire are typed in labd.hostwire."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = [
    "commands", "feed", "jobs", "jobstate", "monitor", "recovery", "spares", "state", "watchdog"
]
