"""Several daemons on one lab: the leader's lease and the standby's takeover."""
