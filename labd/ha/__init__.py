"""Several daemons on one lab: the leader's lease and the standby's takeover."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["leadership", "lease", "role"]
