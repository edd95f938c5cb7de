"""Framework adapters on a running daemon: Bluesky, QCoDeS and scripts use the lab's switches
and meters through labd's API (docs/frameworks.md), so every change a plan makes is one the
daemon records, times, reserves and knows of when it checks for drift.

- ``daemon``: where the daemon answers (a URL and a key, or the lab file it runs) and one
  switch or meter of it, as coroutines on labd.client;
- ``blocking``: the same as plain blocking methods, for scripts and notebooks;
- ``ophyd``: ophyd-async Devices for Bluesky plans (the ``bluesky`` extra);
- ``qcodes``: QCoDeS Instruments, Station YAML included (the ``qcodes`` extra).

Nothing here opens an instrument: the daemon does. The adapters that drive an instrument
directly, for a bench without a daemon, are ``instruments.adapters``.
"""

# Its modules, each imported where it is used: importing the package loads no framework.
__all__ = ["blocking", "daemon", "ophyd", "qcodes"]
