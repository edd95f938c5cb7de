"""The GPU-host agent's parts: per-GPU health from NVML, from ``nvidia-smi`` output, or from
an emulated backend, classified as healthy, degraded or failed (docs/protocols.md §6)."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = [
    "backends", "cli", "health", "links", "metrics", "nics", "nvml", "reporter", "runner",
    "smi", "trainer"
]
