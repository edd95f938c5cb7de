"""The daemon process: the ``Daemon`` (``labd.daemon.core``) owning the lab's instruments,
its HTTP API (``labd.daemon.api``), the MQTT bridge (``labd.daemon.bus``) and its token."""
