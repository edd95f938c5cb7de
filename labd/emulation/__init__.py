"""Emulated labs: the rig that starts emulators (and emulated GPU hosts) for a lab file and
a daemon on them, the failover and light drills, and ``labd demo``."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["campaign", "demo", "drill", "emulators", "rig", "verify"]
