"""Which labd this is: its version and the commit it was built from, for ``labd_build_info``.

The version is the installed package's. The commit is ``$LABD_COMMIT`` where the build set
it (the Containerfile's ``--build-arg LABD_COMMIT``), else the checkout's ``HEAD`` when labd
runs from a git checkout, else ``unknown``: an installed wheel does not know it. The daemon
and the GPU-host agent both put it on their ``/metrics`` (:func:`add_standard_collectors`),
beside prometheus_client's own collectors.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path

from prometheus_client import (
    GC_COLLECTOR,
    CollectorRegistry,
    Gauge,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
)

from labd import __version__

__all__ = ["UNKNOWN", "add_standard_collectors", "commit", "version"]

UNKNOWN = "unknown"
#: A checkout's ``git rev-parse`` answers in milliseconds; one that hangs (a network file
#: system) must not hold up start-up.
GIT_TIMEOUT_S = 2.0


def version() -> str:
    return __version__


@functools.cache
def commit() -> str:
    """The short commit labd was built from, or ``unknown`` (read once per process)."""
    given = os.environ.get("LABD_COMMIT", "").strip()
    if given:
        return given[:40]
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return UNKNOWN
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=GIT_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return UNKNOWN
    head = done.stdout.strip()
    return head if done.returncode == 0 and head else UNKNOWN


def add_standard_collectors(registry: CollectorRegistry) -> None:
    """prometheus_client's process (``process_*``: CPU, memory, open files), platform
    (``python_info``) and garbage-collector (``python_gc_*``) collectors, and
    ``labd_build_info``, on ``registry``: the daemon and the agent each keep a registry of
    their own, so the library's default one, which holds these, is never scraped."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    if GC_COLLECTOR is not None:  # None on interpreters without gc statistics
        GCCollector(registry=registry)
    info = Gauge("labd_build_info", "Always 1: the labd version and commit running",
                 ["version", "commit"], registry=registry)
    info.labels(version(), commit()).set(1)
