"""Circuits and reconfigurations: lab-file entries made into live drivers, per-port
reservations, and the engine that turns a request into one timed, recorded batch per switch."""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["dispatch", "drift", "drivers", "engine", "light", "planning", "preview",
           "reservations", "routing"]
