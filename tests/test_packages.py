"""Each package's ``__all__`` names what it offers, and each name is there to import."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ["labd", "labd.store", "labd.lab", "labd.measure", "labd.client", "labd.mqtt",
            "labd.commands", "labd.ha", "labd.daemon", "labd.daemon.api", "labd.fabric",
            "labd.agent", "labd.hosts", "labd.testing", "labd.emulation", "tui",
            "tui.screens", "tui.tabs", "emulators", "emulators.devices", "emulators.physics",
            "emulators.wire", "labd.commands.measure", "instruments", "instruments.adapters",
            "instruments.transports", "labd.adapters"]


def test_every_package_names_what_it_offers() -> None:
    """A package made later is listed above, or this fails."""
    import pathlib
    root = pathlib.Path(__file__).parent.parent
    found = {".".join(p.parent.relative_to(root).parts)
             for top in ("labd", "tui", "emulators", "instruments")
             for p in (root / top).rglob("__init__.py") if "migrations" not in p.parts}
    assert found <= set(PACKAGES), sorted(found - set(PACKAGES))


@pytest.mark.parametrize("name", PACKAGES)
def test_a_package_offers_what_its_all_names(name: str) -> None:
    package = importlib.import_module(name)
    offered = package.__all__
    assert offered, f"{name}: __all__ is empty"
    for item in offered:
        if not hasattr(package, item):
            importlib.import_module(f"{name}.{item}")  # a module it offers
        assert hasattr(package, item), f"{name}.{item} is named in __all__ but not there"
