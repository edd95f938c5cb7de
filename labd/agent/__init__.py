"""The GPU-host agent's parts: per-GPU health from NVML, from ``nvidia-smi`` output, or from
an emulated backend, classified as healthy, degraded or failed (docs/protocols.md §6)."""
