"""One module per device family: the device model (state, timing, faults, ground truth)
and its protocol interfaces (Polatis SCPI and TL1, CALIENT TL1, Keysight N77xx, Thorlabs
PM100, the Qontrol board). Each speaks its protocol as docs/protocols.md describes it."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["calient", "keysight", "polatis", "qontrol", "thorlabs"]
