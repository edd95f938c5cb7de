"""Each package's ``__all__`` names what it offers, and each name is there to import."""

from __future__ import annotations

import importlib

import pytest

PACKAGES = ["labd.store", "labd.lab", "labd.measure", "labd.client", "labd.mqtt",
            "labd.commands", "tui", "tui.screens", "tui.tabs", "emulators",
            "emulators.devices", "emulators.physics", "emulators.wire"]


@pytest.mark.parametrize("name", PACKAGES)
def test_a_package_offers_what_its_all_names(name: str) -> None:
    package = importlib.import_module(name)
    offered = package.__all__
    assert offered, f"{name}: __all__ is empty"
    for item in offered:
        if not hasattr(package, item):
            importlib.import_module(f"{name}.{item}")  # a module it offers
        assert hasattr(package, item), f"{name}.{item} is named in __all__ but not there"
