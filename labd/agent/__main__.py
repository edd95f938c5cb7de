"""``python -m labd.agent``: the GPU-host agent without the rest of the labd command."""

from labd.agent.cli import main

main()
