"""``labd measure``: reconfiguration campaigns through the API, schedule replays, kept runs,
their reports, exports and plots."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = [
    "campaign", "extras", "figures", "plots", "reconfig", "reports", "runs", "schedule", "stats",
]
