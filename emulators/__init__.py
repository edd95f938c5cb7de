"""Device emulators speaking the real wire protocols, plus their physical models.

An emulator is a device model (state, timing, faults, ground truth) with one or more
protocol interfaces served on TCP ports or ptys. Nothing here imports ``instruments``,
``labd`` or ``tui``: the emulators are an independent implementation of the device side,
so that a parser bug in a driver cannot hide behind the same bug in its emulator.
"""

from emulators.lab import EmulatedLab, EmulatorSpec

__all__ = ["EmulatedLab", "EmulatorSpec"]
