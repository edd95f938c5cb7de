"""Which lab a test session runs: a real lab named by ``--labd-lab FILE`` (no emulation),
else an emulated one, named by the ini setting ``labd_lab`` (a file, or a packaged lab's
name), else the packaged ``demo`` lab. Deciding costs nothing; the lab file is read when a
test first needs it (or at start-up for ``--labd-lab``, so that a mistake in it stops the
run with one message)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from labd.lab.loader import Lab

#: The packaged lab emulated when neither ``--labd-lab`` nor the ini setting names one.
DEFAULT_LAB = "demo"
#: Why a test that needs emulation is skipped on a real lab.
REAL_LAB_SKIP = ("needs the emulators' control endpoint (fault injection, ground truth); "
                 "--labd-lab runs on real hardware")


@dataclass(frozen=True)
class Selection:
    """The session's lab: ``name`` is a path or a packaged lab's name."""

    name: str
    real: bool
    origin: str
    """Where the choice came from, for the report header: the option, the ini, the default."""

    def describe(self) -> str:
        mode = "real hardware, no emulation" if self.real else "emulated"
        return f"labd: lab {self.name} ({mode}; from {self.origin})"


_SELECTION = pytest.StashKey[Selection]()
_LAB = pytest.StashKey["Lab"]()


def select(config: pytest.Config) -> Selection:
    """The session's lab, decided from the option and the ini (once per session)."""
    if _SELECTION in config.stash:
        return config.stash[_SELECTION]
    real = config.getoption("labd_lab", None)
    if real:
        path = Path(real)
        if not path.is_absolute():
            path = config.invocation_params.dir / path
        chosen = Selection(str(path), real=True, origin="--labd-lab")
    else:
        value = str(config.getini("labd_lab") or "").strip()
        if value:
            base = config.inipath.parent if config.inipath is not None else config.rootpath
            path = Path(value)
            if not path.is_absolute() and (base / path).exists():
                path = base / path
            # Otherwise a packaged lab's name (or a path that load_lab will say is missing).
            chosen = Selection(str(path), real=False, origin="ini labd_lab")
        else:
            chosen = Selection(DEFAULT_LAB, real=False, origin="the default")
    config.stash[_SELECTION] = chosen
    return chosen


def lab_of(config: pytest.Config) -> Lab:
    """The session's lab file, parsed (once per session): for a ``pytest_generate_tests``
    that parametrizes over the lab's instruments, as the ``labd_lab`` fixture gives it."""
    if _LAB in config.stash:
        return config.stash[_LAB]
    from labd.errors import LabFileError
    from labd.lab.loader import load_lab

    chosen = select(config)
    try:
        lab = load_lab(chosen.name)
    except LabFileError as exc:
        raise pytest.UsageError(f"{chosen.origin}: {exc}") from None
    if chosen.real:
        emulated = [e.id for e in lab.instrument if e.emulate]
        if emulated:
            raise pytest.UsageError(
                f"--labd-lab {chosen.name}: runs on real hardware, but the file marks "
                f"{', '.join(emulated)} for emulation (emulate = true); give each its real "
                "address with emulate = false, or name the lab in the ini setting labd_lab "
                "to run it emulated")
    config.stash[_LAB] = lab
    return lab
