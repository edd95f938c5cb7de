"""The drivers never need a framework: each adapter imports its own, when it is imported."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("ophyd_async", "bluesky", "qcodes")


def loaded_after(statement: str) -> set[str]:
    probe = (f"import sys; {statement}; "
             f"print(' '.join(m for m in {FRAMEWORKS!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True,
                         text=True, timeout=120)
    return set(out.stdout.split())


def test_the_drivers_and_the_blocking_facade_load_no_framework() -> None:
    assert loaded_after("import instruments, instruments.adapters, "
                        "instruments.adapters.blocking") == set()


def test_each_adapter_loads_its_own_framework_only() -> None:
    assert loaded_after("import instruments.adapters.qcodes") == {"qcodes"}
    assert "qcodes" not in loaded_after("import instruments.adapters.ophyd")


def test_the_daemon_owned_adapters_load_only_their_own_framework() -> None:
    assert loaded_after("import labd.adapters, labd.adapters.daemon, "
                        "labd.adapters.blocking") == set()
    assert loaded_after("import labd.adapters.qcodes") == {"qcodes"}
    assert "qcodes" not in loaded_after("import labd.adapters.ophyd")
