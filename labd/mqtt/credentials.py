"""A lab's MQTT secrets, one TOML file per identity, written by ``labd broker-config``::

    lab = "demo"
    instance = ""             # optional: the lab instance these topics belong to
    username = "demo.h1"      # the broker login, where the broker asks for one
    password = "..."
    [hosts]                   # signing keys (hex): the daemon's file holds every host's,
    h1 = "5f0c..."            #   a host's file only its own
    [clients]                 # who may send switch commands over the bus (the daemon's
    ci = "9a1d..."            #   file: all of them; a client's file: its own)
    [tls]                     # optional, for an mqtts:// broker (paths relative to this file)
    ca = "ca.pem"             #   the CA that signed the broker's certificate (default: the
    cert = "client.pem"       #   system's); a client certificate and key, where the broker
    key = "client.key"        #   asks for one

The file is created with mode 0600 and refused when others may read it.
"""

from __future__ import annotations

import os
import ssl
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import tomli_w

from labd.errors import BusError
from labd.files import TomlError, open_to_others, read_toml, write_private
from labd.mqtt.client import parse_url, wants_tls
from labd.mqtt.topics import check_instance


@dataclass(frozen=True)
class Credentials:
    """Who we are on the broker and whose seals we know (empty: an open broker, no keys)."""

    username: str | None = None
    password: str | None = None
    hosts: Mapping[str, bytes] = field(default_factory=dict)
    clients: Mapping[str, bytes] = field(default_factory=dict)
    lab: str = ""
    instance: str = ""
    tls: Mapping[str, str] = field(default_factory=dict)
    """``ca``, ``cert``, ``key``: absolute paths of PEM files, for an mqtts:// broker."""

    def for_host(self, host: str) -> Credentials:
        """What a host's agent needs: the login and its own key (and no one else's)."""
        key = self.hosts.get(host)
        return Credentials(self.username, self.password, {host: key} if key else {},
                           lab=self.lab, instance=self.instance, tls=self.tls)

    def with_keys(self, hosts: Mapping[str, bytes] = {},
                  clients: Mapping[str, bytes] = {}) -> Credentials:
        """These credentials with more keys (ours win where both name one)."""
        return replace(self, hosts={**hosts, **self.hosts}, clients={**clients, **self.clients})

    def as_toml(self) -> dict[str, Any]:
        data: dict[str, Any] = {"lab": self.lab}
        if self.instance:
            data["instance"] = self.instance
        if self.username is not None:
            data["username"], data["password"] = self.username, self.password or ""
        data["hosts"] = {h: k.hex() for h, k in sorted(self.hosts.items())}
        data["clients"] = {c: k.hex() for c, k in sorted(self.clients.items())}
        if self.tls:
            data["tls"] = dict(self.tls)
        return data

    def write(self, path: Path, *, note: str = "") -> None:
        """Write the file, readable by its owner only from the first byte."""
        text = (f"# {note}\n" if note else "") + tomli_w.dumps(self.as_toml())
        write_private(path, text)


def _keys(path: Path, data: dict[str, Any], table: str) -> dict[str, bytes]:
    entries = data.get(table, {})
    if not isinstance(entries, dict):
        raise BusError(f"{path}: [{table}] must be a table of name = \"hex key\"")
    keys = {}
    for name, value in entries.items():
        try:
            key = bytes.fromhex(value) if isinstance(value, str) else b""
        except ValueError:
            key = b""
        if len(key) < 16:
            raise BusError(f"{path}: [{table}] {name}: expected a key of at least 16 bytes "
                           "in hex (labd broker-config makes them)")
        keys[str(name)] = key
    return keys


TLS_FILES = ("ca", "cert", "key")


def _tls(path: Path, data: dict[str, Any]) -> dict[str, str]:
    entries = data.get("tls", {})
    if not isinstance(entries, dict) or not all(
            k in TLS_FILES and isinstance(v, str) and v for k, v in entries.items()):
        raise BusError(f"{path}: [tls] takes only ca, cert and key, each a file path")
    if "key" in entries and "cert" not in entries:
        raise BusError(f"{path}: [tls] key without cert: give the client certificate too")
    return {k: str((path.parent / v).resolve()) for k, v in entries.items()}


def read_credentials(path: str | os.PathLike[str]) -> Credentials:
    """The credentials in ``path``; a clear :class:`BusError` for a file that is missing,
    readable by others, or wrong."""
    file = Path(path)
    try:
        info = file.stat()
        if open_to_others(info.st_mode):
            raise BusError(f"{file}: others may read it (mode {stat.filemode(info.st_mode)}); "
                           f"it holds secrets: chmod 600 {file}")
        data = read_toml(file)
    except OSError as exc:
        raise BusError(f"MQTT credentials {file}: {exc.strerror or exc}") from None
    except TomlError as exc:
        raise BusError(f"MQTT credentials {file}: {exc}") from None
    username, password = data.get("username"), data.get("password")
    if username is not None and (not isinstance(username, str) or not isinstance(password, str)):
        raise BusError(f"{file}: 'username' and 'password' must both be text")
    lab, instance = data.get("lab", ""), data.get("instance", "")
    if not isinstance(lab, str) or not isinstance(instance, str):
        raise BusError(f"{file}: 'lab' and 'instance' must be text")
    try:
        check_instance(instance)
    except BusError as exc:
        raise BusError(f"{file}: {exc}") from None
    return Credentials(username, password, _keys(file, data, "hosts"),
                       _keys(file, data, "clients"), lab, instance, _tls(file, data))


@dataclass(frozen=True)
class BusSettings:
    """A lab's broker as one client sees it: where it is, the lab instance whose topics it
    uses, and its credentials."""

    url: str
    instance: str = ""
    credentials: Credentials = field(default_factory=Credentials)

    def __post_init__(self) -> None:
        parse_url(self.url)  # a bad URL is a clear error now, not a retry loop later
        check_instance(self.instance)

    @classmethod
    def load(cls, url: str, credentials: str | os.PathLike[str] | None = None,
             instance: str | None = None) -> BusSettings:
        """The settings a command line gives: the broker, a credentials file (its instance
        unless ``instance`` is given)."""
        creds = read_credentials(credentials) if credentials else Credentials()
        return cls(url, instance if instance is not None else creds.instance, creds)

    @classmethod
    def of(cls, value: str | BusSettings) -> BusSettings:
        return value if isinstance(value, BusSettings) else cls(value)

    def for_host(self, host: str) -> BusSettings:
        """The broker as one host's agent uses it: with only that host's key."""
        return replace(self, credentials=self.credentials.for_host(host))

    def with_keys(self, hosts: Mapping[str, bytes] = {},
                  clients: Mapping[str, bytes] = {}) -> BusSettings:
        return replace(self, credentials=self.credentials.with_keys(hosts, clients))

    def login(self) -> dict[str, Any]:
        """aiomqtt.Client's keyword arguments for the broker and its login."""
        host, port = parse_url(self.url)
        options: dict[str, Any] = {"hostname": host, "port": port,
                                   "username": self.credentials.username,
                                   "password": self.credentials.password}
        if wants_tls(self.url):
            options["tls_context"] = self.tls_context()
        return options

    def tls_context(self) -> ssl.SSLContext:
        """The TLS context for an mqtts:// broker: its certificate checked against the CA in
        the credentials' [tls] (else the system's), our own certificate where one is given."""
        files = self.credentials.tls
        try:
            context = ssl.create_default_context(cafile=files.get("ca"))
            if "cert" in files:
                context.load_cert_chain(files["cert"], files.get("key"))
        except (OSError, ssl.SSLError) as exc:
            named = ", ".join(f"{k} {v}" for k, v in files.items()) or "the system's CAs"
            raise BusError(f"MQTT TLS ({named}): {exc}") from None
        return context
