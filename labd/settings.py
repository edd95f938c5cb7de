"""The daemon's settings in one place, and where each came from.

pydantic-settings layers four sources, each over the one before it:

1. **default**: the values below;
2. **file**: the ``[daemon]`` table of a settings file (``labd run --config FILE``), over
   that of the lab file where it has one (the installation's file wins over the lab's);
3. **env**: ``LABD_<NAME>`` for each setting (``LABD_PORT=8471``, ``LABD_DB=postgresql://...``);
   an empty variable counts as unset;
4. **flag**: ``labd run``'s options.

labd reads the files (labd.files, so that a file it cannot read is one line naming it) and
keeps what each source gave, for ``labd config show``. A value that cannot be used is one
:class:`SettingsError` naming the setting, the source and what was expected.

The token itself is no setting: it stays in ``$LABD_TOKEN`` or the token file
(labd.token), so that no settings file or ``config show`` ever holds it."""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from labd.errors import LabdError
from labd.files import TomlError, read_toml
from labd.logs import LogSettingsError, parse_levels

__all__ = ["ENV_PREFIX", "Resolved", "Settings", "SettingsError", "Source", "check_table",
           "daemon_table", "env_name", "layered", "mask_url", "resolve"]

ENV_PREFIX = "LABD_"
Source = Literal["default", "file", "env", "flag"]


class SettingsError(LabdError):
    """A setting that cannot be used: the message names it, its source and what to give."""


class Settings(BaseSettings):
    """What ``labd run`` runs with (docs/service.md lists each). Built by :func:`resolve`,
    which names its sources: constructed bare, it would read this process's environment."""

    model_config = SettingsConfigDict(extra="forbid", frozen=True, allow_inf_nan=False,
                                      env_prefix=ENV_PREFIX)

    host: str = "127.0.0.1"
    """The address the API listens on."""
    port: int = Field(default=8470, ge=0, le=65535)
    db: str = "labd.sqlite"
    """The store: a SQLite file, or a PostgreSQL URL."""
    mqtt: str | None = None
    """The MQTT broker, mqtt://HOST[:PORT] or mqtts://."""
    mqtt_credentials: str | None = None
    """The daemon's MQTT credentials file (labd broker-config writes daemon.toml)."""
    instance: str | None = None
    token_file: str | None = None
    access: str | None = None
    open_reads: bool = False
    metrics_need_key: bool = False
    """``GET /metrics`` only with a viewer's key (or better); by default Prometheus scrapes
    it without one."""
    max_body: int = Field(default=1 << 20, ge=0, le=1 << 30)
    tls_cert: str | None = None
    tls_key: str | None = None
    restore: bool = True
    watch_interval_s: float | None = Field(default=None, ge=0, le=3600)
    """The liveness watch's interval for every instrument whose lab entry sets none."""
    log_level: str = "warning"
    log_format: Literal["human", "json"] = "human"
    log_file: str | None = None
    log_file_max_bytes: int = Field(default=10 << 20, ge=4096, le=1 << 40)
    log_file_backups: int = Field(default=5, ge=0, le=1000)
    ha_url: str | None = None
    """For ``--ha`` (several daemons, one leader): the PostgreSQL database holding the
    lease."""
    lease_renew_s: float = Field(default=0.5, gt=0, le=60)
    lease_ttl_s: float = Field(default=2.0, gt=0, le=600)
    cpu: Annotated[int, Field(ge=0, le=4095)] | Literal["auto"] | None = None
    """The one CPU the event loop runs on, and the store's writer with it (Linux): a
    number, or ``auto`` for the one the loop is on at start; none: wherever the kernel puts
    it (labd.daemon.placement)."""

    @field_validator("log_level")
    @classmethod
    def _levels(cls, value: str) -> str:
        try:
            parse_levels(value)
        except LogSettingsError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("host", "db")
    @classmethod
    def _not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @model_validator(mode="after")
    def _pairs(self) -> Settings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        if 2 * self.lease_renew_s > self.lease_ttl_s:
            raise ValueError(f"lease_renew_s ({self.lease_renew_s:g}) must be at most half "
                             f"lease_ttl_s ({self.lease_ttl_s:g}): one late renewal must not "
                             "cost the lead")
        return self


#: Settings whose values are URLs that may carry a password (masked when shown).
URLS = ("db", "mqtt", "ha_url")
NAMES = tuple(Settings.model_fields)


def env_name(setting: str) -> str:
    return ENV_PREFIX + setting.upper()


#: ``labd run``'s options whose names are not their setting's.
FLAGS = {"watch_interval_s": "--watch-interval", "ha_url": "--ha",
         "lease_renew_s": "--lease-renew", "lease_ttl_s": "--lease-ttl"}


def flag_name(setting: str) -> str:
    return FLAGS.get(setting) or "--" + setting.replace("_", "-")


@dataclass(frozen=True)
class Resolved:
    """The settings in effect, and for each where its value came from."""

    settings: Settings
    sources: dict[str, Source]
    where: dict[str, str]
    """Per setting, its source in words: ``default``, ``file labd.toml``, ``env LABD_PORT``,
    ``flag --port``."""

    def source(self, name: str) -> Source:
        return self.sources[name]

    def shown(self, name: str) -> str:
        """The value as ``config show`` prints it: URLs without their passwords."""
        value = getattr(self.settings, name)
        if value is None:
            return "(none)"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return f"{value:g}"
        if name in URLS:
            return mask_url(str(value))
        return str(value)


def mask_url(url: str) -> str:
    """``scheme://user:***@host/...``: the URL without its password."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = f"{parts.username or ''}:***@{parts.hostname or ''}"
        if parts.port is not None:
            netloc += f":{parts.port}"
        return urlunsplit(parts._replace(netloc=netloc))
    except ValueError:
        return url if "@" not in url else "***"


def daemon_table(path: str | os.PathLike[str], *, label: str | None = None,
                 required: bool = False) -> dict[str, Any] | None:
    """The ``[daemon]`` table of a TOML file (None if it has none, unless ``required``)."""
    shown = label or str(path)
    try:
        data = read_toml(path)
    except FileNotFoundError:
        raise SettingsError(f"{shown}: no such settings file") from None
    except OSError as exc:
        raise SettingsError(f"{shown}: cannot be read: {exc.strerror or exc}") from None
    except TomlError as exc:
        raise SettingsError(f"{shown}: {exc}") from None
    table = data.get("daemon")
    if table is None:
        if required:
            others = ", ".join(repr(k) for k in data) or "nothing"
            raise SettingsError(f"{shown}: the settings go under a [daemon] table; the file "
                                f"holds {others}")
        return None
    if not isinstance(table, dict):
        raise SettingsError(f"{shown}: 'daemon' must be a table ([daemon]), not a "
                            f"{type(table).__name__}")
    if required:
        extra = [k for k in data if k != "daemon"]
        if extra:
            raise SettingsError(f"{shown}: a settings file holds only [daemon]; found "
                                f"{', '.join(repr(k) for k in extra)}")
    return table


def _unknown(name: str, where: str) -> SettingsError:
    close = difflib.get_close_matches(name, NAMES, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return SettingsError(f"{where}: no setting {name!r}{hint}; the settings: "
                         f"{', '.join(NAMES)}")


class _Given(InitSettingsSource):
    """A source of given values (a ``[daemon]`` table, the flags), as pydantic-settings'
    own source of a constructor's arguments."""

    def __init__(self, values: Mapping[str, Any]) -> None:
        super().__init__(Settings, dict(values))


class _Env(EnvSettingsSource):
    """``LABD_*`` from ``environment`` rather than always ``os.environ`` (a test's, a
    benchmark's); a value is stripped, and a blank one counts as unset."""

    def __init__(self, environment: Mapping[str, str]) -> None:
        self._environment = environment
        super().__init__(Settings)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return {key.lower(): value.strip() for key, value in self._environment.items()
                if key.upper().startswith(ENV_PREFIX) and value.strip()}


def _build(sources: Sequence[PydanticBaseSettingsSource]) -> Settings:
    """Settings from ``sources``, the first winning (pydantic-settings' own layering); the
    defaults under them all. ValidationError as pydantic gives it."""
    # The keyword is BaseSettings' own; mypy reads the signature from the fields alone.
    return Settings(_build_sources=(tuple(sources), {}))  # type: ignore[call-arg]


def check_table(table: Mapping[str, Any]) -> list[str]:
    """What is wrong with a ``[daemon]`` table on its own: names that are no setting and
    values no setting takes, one problem each (``field 'port': ...``). What only the
    settings together decide (tls_cert without tls_key, a lease renewed slower than it
    lapses) is left to :func:`resolve`: another source may complete the pair."""
    problems: list[str] = []
    known: dict[str, Any] = {}
    for name, value in table.items():
        if name in NAMES:
            known[name] = value
            continue
        close = difflib.get_close_matches(name, NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        problems.append(f"field {name!r}: no setting of that name{hint}")
    try:
        _build([_Given(known)])
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            loc = error.get("loc") or ()
            if not loc or not isinstance(loc[0], str):
                continue  # a check across settings: resolve() makes it with every source
            message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
            problems.append(f"field {loc[0]!r}: {message} (got "
                            f"{_shown_raw(loc[0], known.get(loc[0]))})")
    return problems


def resolve(*, files: Sequence[tuple[str, Mapping[str, Any]]] = (),
            env: Mapping[str, str] | None = None,
            flags: Mapping[str, Any] | None = None) -> Resolved:
    """The settings from the defaults, ``files`` (``(label, [daemon] table)``, later ones
    winning), ``env`` (default: this process's environment) and ``flags`` (the options
    given, by setting name; None means not given)."""
    for label, table in files:
        for name in table:
            if name not in NAMES:
                raise _unknown(name, f"{label} [daemon]")
    for name in flags or {}:
        if name not in NAMES:
            raise _unknown(name, "flags")
    given = _Given({k: v for k, v in (flags or {}).items() if v is not None})
    environment = _Env(os.environ if env is None else env)
    tables = [(label, _Given(table)) for label, table in reversed(files)]
    # Where each value came from: the first of the sources, in pydantic-settings' order,
    # that gives it. pydantic-settings keeps no such record, so each source is asked here
    # too (a dict of a few entries).
    layers: list[tuple[Source, str, PydanticBaseSettingsSource]] = [
        ("flag", "", given), ("env", "", environment),
        *(("file", label, source) for label, source in tables)]
    values: dict[str, Any] = {}
    sources: dict[str, Source] = {name: "default" for name in NAMES}
    where: dict[str, str] = {name: "default" for name in NAMES}
    for kind, label, source in reversed(layers):
        for name, value in source().items():
            values[name], sources[name] = value, kind
            where[name] = {"flag": f"flag {flag_name(name)}", "env": f"env {env_name(name)}",
                           "file": f"file {label}"}[kind]
    try:
        settings = _build([source for _, _, source in layers])
    except ValidationError as exc:
        raise SettingsError(_explain(exc, values, where)) from None
    return Resolved(settings, sources, where)


def layered(lab: tuple[str, Mapping[str, Any]] | None = None, *,
            config: str | os.PathLike[str] | None = None,
            flags: Mapping[str, Any] | None = None,
            env: Mapping[str, str] | None = None) -> Resolved:
    """A daemon's settings: the defaults, its lab's ``[daemon]`` table (``(label, table)``),
    the ``--config`` file's, ``LABD_*`` (``env``, default this process's) and ``flags``,
    each over the one before. ``labd run``, ``labd config show`` and every program that
    assembles a daemon (labd.daemon.assembly) resolve their settings here."""
    files: list[tuple[str, Mapping[str, Any]]] = []
    if lab is not None and lab[1]:
        files.append(lab)
    if config is not None:
        table = daemon_table(config, required=True)
        assert table is not None
        files.append((str(config), table))
    return resolve(files=files, env=env, flags=flags)


def _explain(exc: ValidationError, values: Mapping[str, Any], where: Mapping[str, str]) -> str:
    problems = []
    for error in exc.errors(include_url=False):
        loc = error.get("loc") or ()
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if loc and isinstance(loc[0], str) and loc[0] in values:
            name = loc[0]
            shown = _shown_raw(name, values[name])
            problems.append(f"setting {name} = {shown} (from {where[name]}): {message}")
        else:
            involved = [n for n in NAMES if n in message and n in values]
            origin = "; ".join(f"{n} from {where[n]}" for n in involved)
            problems.append(message + (f" ({origin})" if origin else ""))
    return "bad settings:\n  " + "\n  ".join(problems)


def _shown_raw(name: str, value: Any) -> str:
    shown = repr(mask_url(value) if name in URLS and isinstance(value, str) else value)
    return shown if len(shown) <= 60 else shown[:57] + "..."

