"""The physical model behind the emulators: light through fibers and switches (optics),
cross-connect timing, the MZI mesh, what a meter reads, and the ground truth every change
leaves (when its command arrived, when light settled)."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["crossconnect", "mesh", "meters", "optics", "timing", "truth"]
