"""``labd measure``: reconfiguration campaigns through the API, schedule replays, kept runs,
their reports, exports and plots."""
