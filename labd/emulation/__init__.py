"""Emulated labs: the rig that starts emulators (and emulated GPU hosts) for a lab file and
a daemon on them, the failover and light drills, and ``labd demo``."""
