"""The daemon process: the ``Daemon`` (``labd.daemon.core``) owning the lab's instruments and
background loops, the services it hands its HTTP API (``labd.daemon.api``) and its MQTT
bridge (``labd.daemon.bus``) in place of itself (``labd.daemon.services``), and its bearer
token (``labd.token``)."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = [
    "access", "api", "assembly", "bus", "bus_commands", "core", "metrics", "placement", "server",
    "services", "tallies"
]
