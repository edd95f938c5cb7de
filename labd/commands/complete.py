"""Shell completion of values, not only of commands and options: the choices an option
takes (``--pattern``, ``--format``, ``--log-format``, ``--log-level``, ``--signal``,
``--backend``), lab names (packaged and ``*.toml`` files), the runs kept in a runs store
(``labd measure show``, ``compare``, ``--resume``), and a lab file's switches
(``labd measure reconfig --lab LAB --switch``).

Attached to the command tree once it is built (:func:`attach`, from ``labd.commands.main``),
by each parameter's name, so that the commands declare nothing for it. A completer never
raises and never writes: a runs store that does not exist is not made, a lab file that does
not parse completes nothing.
"""

from __future__ import annotations

import sqlite3
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

__all__ = ["attach", "lab_names", "run_names", "switch_ids"]

Completer = Callable[[Any, Any, str], list[str]]

#: Switch drivers, as a lab file names them (labd.lab.entries.SWITCH_ENTRIES' drivers).
SWITCH_DRIVERS = ("polatis-scpi", "polatis-tl1", "calient-tl1", "qontrol-mesh")
#: The runs store the measure commands use when given none (``--runs``).
DEFAULT_RUNS = "labd-runs.sqlite"


def _starting(words: Iterable[str], incomplete: str) -> list[str]:
    return [w for w in words if w.startswith(incomplete)]


def choices(*words: str) -> Completer:
    return lambda ctx, param, incomplete: _starting(words, incomplete)


def _log_levels(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """``info``, or after a comma a level for the whole or ``NAME=LEVEL``'s level."""
    from labd.logs import LEVELS

    head, comma, last = incomplete.rpartition(",")
    prefix = head + comma
    name, equals, level = last.rpartition("=")
    prefix += name + equals
    return [prefix + word for word in LEVELS if word.startswith(level)]


def lab_names(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """Packaged labs, and lab files (``*.toml``) in the folder being typed."""
    from labd.lab.loader import packaged_labs

    found = _starting(sorted(packaged_labs()), incomplete)
    folder = Path(incomplete).parent if "/" in incomplete else Path(".")
    try:
        files = sorted(str(p) if "/" in incomplete else p.name
                       for p in folder.iterdir() if p.suffix == ".toml" or p.is_dir())
    except OSError:
        files = []
    return found + _starting(files, incomplete)


def run_names(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """The runs kept in the store ``--runs`` names (newest first); a SQLite file only, and
    only one that exists: completing must not make one."""
    store = (ctx.params.get("runs") if ctx is not None else None) or DEFAULT_RUNS
    path = Path(str(store).removeprefix("sqlite:///"))
    if ("://" in str(store) and not str(store).startswith("sqlite:///")) or not path.is_file():
        return []
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5) as db:
            names = [row[0] for row in db.execute("SELECT name FROM runs ORDER BY id DESC")]
    except sqlite3.Error:
        return []
    return _starting(names, incomplete)


def switch_ids(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """The switches of the lab ``--lab`` names (file or packaged name), read as TOML alone:
    a completion is no place to validate a lab file."""
    from labd.lab.loader import packaged_labs

    lab = ctx.params.get("lab") if ctx is not None else None
    if not lab:
        return []
    path = Path(lab) if Path(lab).is_file() else packaged_labs().get(str(lab))
    if path is None:
        return []
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return []
    entries = data.get("instrument", [])
    ids = [str(e.get("id")) for e in entries if isinstance(e, dict)
           and e.get("driver") in SWITCH_DRIVERS and e.get("id")]
    return _starting(ids, incomplete)


def _signals(ctx: Any, param: Any, incomplete: str) -> list[str]:
    from labd.agent.backends import SIGNALS  # loaded when asked, not on every labd command

    return _starting(SIGNALS, incomplete)


def _completers() -> dict[tuple[str, str], Completer]:
    from labd.logs import FORMATS as LOG_FORMATS

    return {
        ("option", "pattern"): choices("toggle", "random", "permutation", "sweep"),
        ("option", "plot_format"): choices("png", "svg", "pdf"),
        ("option", "log_format"): choices(*LOG_FORMATS),
        ("option", "log_level"): _log_levels,
        ("option", "signal_name"): _signals,
        ("option", "backend"): choices("auto", "nvml", "nvidia-smi", "emulated"),
        ("argument", "lab"): lab_names,
        ("option", "lab"): lab_names,
        ("argument", "name"): run_names,
        ("argument", "first"): run_names,
        ("argument", "second"): run_names,
        ("option", "resume"): run_names,
        ("option", "switch"): switch_ids,
    }



def attach(command: Any) -> Any:
    """Give each parameter of ``command`` and its subcommands that has no completion of its
    own the completer its name calls for; ``command``, for chaining."""
    table = _completers()
    stack = [command]
    while stack:
        current = stack.pop()
        stack.extend(getattr(current, "commands", {}).values())
        for param in getattr(current, "params", []):
            completer = table.get((param.param_type_name, param.name))
            if current.name == "agent" and param.name == "lab":
                continue  # the agent's --lab is the lab's name, not its file
            if completer is not None and getattr(param, "_custom_shell_complete", 0) is None:
                # The attribute typer fills from a parameter's own ``shell_complete=``.
                param._custom_shell_complete = completer
    return command
