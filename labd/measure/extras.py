"""The optional packages some outputs need (the ``measure`` extra), checked before a
campaign starts: a missing one is a message at once, not after the run has been measured."""

from __future__ import annotations

import importlib

from labd.errors import LabdError

INSTALL = "pip install 'labd[measure]'"


def _missing(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ImportError:
        return True
    return False


def require(*, plots: bool = False, parquet: bool = False) -> None:
    """Raise where an output asked for needs a package that cannot be imported."""
    wanted = [(option, package, module) for option, package, module, asked in (
        ("--plots", "matplotlib", "matplotlib", plots),
        ("--parquet", "pyarrow", "pyarrow.parquet", parquet)) if asked]
    missing = [(option, package) for option, package, module in wanted if _missing(module)]
    if missing:
        said = " and ".join(f"{option} needs {package}" for option, package in missing)
        raise LabdError(f"{said}, which is not installed: {INSTALL}, or leave "
                        f"{' and '.join(option for option, _ in missing)} out")
