"""GPU hosts and the jobs on them: what the agents report (``monitor``), choosing a spare
(``spares``), and recovering a job when a member fails (``jobs``)."""
