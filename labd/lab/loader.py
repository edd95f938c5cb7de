"""Loading a lab file, by path or packaged name, into a checked :class:`Lab`.

``load_lab(path_or_name)`` returns a validated :class:`Lab` (labd.lab.model, its entries in
labd.lab.entries) or raises :class:`LabFileError` whose lines each name the file, the entry
and the field, and say what is expected (docs/lab-file.md for every field). A bare name
(``demo``) refers to a lab packaged with labd.
"""

from __future__ import annotations

import hashlib
import os
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from labd.errors import LabFileError
from labd.files import TomlError, loads_toml
from labd.lab.entries import (
    DRIVERS,
    METER_ENTRIES,
    NODE,
    SWITCH_ENTRIES,
    CalientTl1Entry,
    EmulatorSettings,
    EndpointEntry,
    FiberEntry,
    HostEntry,
    Instrument,
    InstrumentBase,
    JobEmulator,
    JobEntry,
    KeysightEntry,
    LabSection,
    MeshEntry,
    PolatisScpiEntry,
    PolatisTl1Entry,
    SwitchEntry,
    ThorlabsEntry,
    Tl1Credentials,
    topology_links,
)
from labd.lab.limits import MAX_DEPTH, MAX_FILE_BYTES, deepest
from labd.lab.model import Lab

# The entries and the model are re-exported: the rest of labd imports them from here.
__all__ = [
    "DRIVERS", "METER_ENTRIES", "SWITCH_ENTRIES", "CalientTl1Entry", "EmulatorSettings",
    "EndpointEntry", "FiberEntry", "HostEntry", "Instrument", "InstrumentBase", "JobEmulator",
    "JobEntry", "KeysightEntry", "Lab", "LabSection", "MeshEntry", "PolatisScpiEntry",
    "PolatisTl1Entry", "SwitchEntry", "ThorlabsEntry", "Tl1Credentials", "file_sha256",
    "load_lab", "packaged_labs", "parse_lab", "parse_text", "resolve_lab_path",
    "topology_links",
]


def packaged_labs() -> dict[str, Path]:
    folder = resources.files("labd") / "labs"
    return {Path(str(p)).stem: Path(str(p)) for p in folder.iterdir()
            if str(p).endswith(".toml")}


def resolve_lab_path(name_or_path: str | os.PathLike[str]) -> Path:
    text = str(name_or_path)
    path = Path(text)
    shown = text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"
    try:
        if path.exists():
            return path
    except (OSError, ValueError) as exc:  # a name too long for the system, a NUL in it
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise LabFileError(shown, [f"{shown}: cannot be a lab file's name: {reason}"]) from None
    labs = packaged_labs()
    if text in labs:
        return labs[text]
    raise LabFileError(shown, [
        f"{shown}: no such file, and no packaged lab of that name "
        f"(packaged: {', '.join(sorted(labs))})"
    ])


def _where(data: dict[str, Any], loc: tuple[int | str, ...]) -> tuple[str, tuple[int | str, ...]]:
    """Turn a pydantic location into 'instrument #2 (id "ocs1")' and the rest of the path."""
    if len(loc) >= 2 and loc[0] == "instrument" and isinstance(loc[1], int):
        index = loc[1]
        rest = loc[2:]
        if rest and isinstance(rest[0], str) and rest[0] in DRIVERS:
            rest = rest[1:]  # the discriminator's tag, not a field
        entries = data.get("instrument")
        entry = entries[index] if isinstance(entries, list) and index < len(entries) else None
        ident = entry.get("id") if isinstance(entry, dict) else None
        shown = f" (id {ident!r})" if isinstance(ident, str) and ident and len(ident) <= 64 \
            else ""
        label = f"[[instrument]] #{index + 1}{shown}"
        return label, rest
    if len(loc) >= 2 and loc[0] in ("endpoint", "fiber", "host", "job") and isinstance(
            loc[1], int):
        return f"[[{loc[0]}]] #{loc[1] + 1}", loc[2:]
    if loc and loc[0] in ("lab", "daemon"):
        return f"[{loc[0]}]", loc[1:]
    return "", loc


def _explain(err: Any) -> str:
    kind = err["type"]
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field (check the spelling; see docs/lab-file.md)"
    if kind == "union_tag_invalid":
        return (f"unknown driver {err['ctx']['tag']!r}; expected one of "
                f"{err['ctx']['expected_tags']}")
    if kind == "string_pattern_mismatch" and err.get("ctx", {}).get("pattern") == NODE:
        return (f"{_shown(err['input'])} is not an endpoint id, 'switch:port' or "
                f"'meter:channel' (a number of at most six digits)")
    if kind == "string_pattern_mismatch":
        return (f"{_shown(err['input'])} must start with a letter or digit and hold only letters, "
                "digits, '_', '.' and '-'")
    if kind == "union_tag_not_found":
        return "needs a 'driver' field"
    message = str(err["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    return f"{message} (got {_shown(err['input'])})" if "input" in err and not isinstance(
        err["input"], dict | list) else message


def _shown(value: Any, limit: int = 60) -> str:
    """A value in a message: its repr, cut short (a message names a value, not all of it)."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def file_sha256(source: str) -> str:
    """The SHA-256 of a lab file (measurement runs name the lab they ran on by it); empty
    for a lab that has no file."""
    try:
        return hashlib.sha256(Path(source).read_bytes()).hexdigest()
    except OSError:
        return ""


def parse_lab(data: dict[str, Any], source: str) -> Lab:
    try:
        return Lab.model_validate({**data, "source": source})
    except RecursionError:
        raise LabFileError(source, [f"{source}: nests too deeply to check (at most "
                                    f"{MAX_DEPTH} levels of tables and arrays)"]) from None
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            label, rest = _where(data, tuple(err["loc"]))
            field = ".".join(str(p) for p in rest)
            if not label and not field:  # a whole-file check: its message names the entry
                problems.append(f"{source}: {_explain(err)}")
                continue
            where = label or "top level"
            problems.append(f"{source}: {where}" + (f", field '{field}'" if field else "")
                            + f": {_explain(err)}")
        raise LabFileError(source, problems) from None


def load_lab(name_or_path: str | os.PathLike[str]) -> Lab:
    path = resolve_lab_path(name_or_path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise LabFileError(str(path), [f"{path}: cannot read: {exc}"]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise LabFileError(str(path), [f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB; "
                                       "a lab file is a few hundred KB at most"])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise LabFileError(str(path), [f"{path}: cannot read: not UTF-8 text ({exc.reason} "
                                       f"at byte {exc.start})"]) from None
    return parse_text(text, str(path))


def parse_text(text: str, source: str) -> Lab:
    """A lab file's text: TOML, bounded (nesting, numbers), then checked field by field."""
    try:
        data = loads_toml(text)
    except TomlError as exc:
        raise LabFileError(source, [f"{source}: {exc}"]) from None
    if deepest(data) > MAX_DEPTH:
        raise LabFileError(source, [f"{source}: tables or arrays nest too deeply (at most "
                                    f"{MAX_DEPTH} levels)"])
    return parse_lab(data, source)
