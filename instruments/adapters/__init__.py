"""The drivers in the frameworks labs script in, each on the drivers' public API alone:

- :mod:`instruments.adapters.blocking`: every driver call as a plain blocking method, for
  scripts and notebooks (no extra needed);
- :mod:`instruments.adapters.ophyd`: ophyd-async Devices for Bluesky plans (the ``bluesky``
  extra);
- :mod:`instruments.adapters.qcodes`: QCoDeS Instruments with Parameters, for a station
  (the ``qcodes`` extra).

Nothing here is imported by ``import instruments``, and importing this package loads no
framework: each module imports its own, so only the one in use needs installing.
"""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["blocking", "ophyd", "qcodes"]
