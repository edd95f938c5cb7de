"""labd's pytest plugin for hardware-in-the-loop CI (docs/hil.md): fixtures that give a test
a lab (``labd_lab``), a daemon running on it (``labd_daemon``), an API client
(``labd_client``) and, where the lab is emulated, the emulators' control endpoint
(``labd_emulators``: faults, ground truth). The same tests run against the emulators (the
default) and, unchanged, against a real lab with ``pytest --labd-lab FILE``.

Installing labd registers the plugin (``[project.entry-points.pytest11]``); it is
``labd.testing.plugin``. Importing it costs nothing beyond pytest: what starts a lab is
imported when a test first asks for one. Parts:

- ``plugin``: the option, the ini setting, the marker and the fixtures;
- ``selection``: which lab a session runs, and whether it is emulated;
- ``running``: the lab (its emulators and a daemon) served from a thread of its own;
- ``clients``: what a test holds (the emulators' client), and what is put back after it.
"""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["clients", "plugin", "running", "selection"]
