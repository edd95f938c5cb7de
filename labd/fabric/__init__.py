"""Circuits and reconfigurations: lab-file entries made into live drivers, per-port
reservations, and the engine that turns a request into one timed, recorded batch per switch."""
