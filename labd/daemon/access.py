"""Who may do what through the API: three roles, each granting the one below it (``admin``
⊇ ``operator`` ⊇ ``viewer``), and the keys that carry them — the daemon's one token
(admin), or an access file of tokens and SHA-256 digests of tokens, each with its role:

.. code-block:: toml

    open_reads = false          # true: reads and the event stream need no token

    [[key]]
    name = "dashboard"          # named in the daemon's log, never the token
    role = "viewer"
    sha256 = "9f86d081884c7d65..."   # hex digest of the token (sha256sum of it, no newline)

    [[key]]
    name = "ci"
    role = "operator"
    token = "..."               # the token itself (keep the file 0600)

    [[key]]
    host = "h1"                 # a host key: /v1/agents/h1/* and nothing else
    token = "..."

No web framework here: the daemon's settings are built from this before any server is.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import ssl
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

from labd.errors import AccessError
from labd.files import TomlError, read_toml
from labd.lab.limits import ID

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = get_args(Role)
"""Lowest first: each role may do what the ones before it may."""

#: The body a request may carry, unless the settings say otherwise.
DEFAULT_MAX_BODY = 1 << 20


def grants(held: Role, needed: Role) -> bool:
    """Whether a key of role ``held`` may do what needs ``needed``."""
    return ROLES.index(held) >= ROLES.index(needed)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


@dataclass(frozen=True)
class Key:
    name: str
    role: Role | None
    """None for a host key: it holds no role, only its host's agent routes."""
    sha256: bytes
    """The SHA-256 of the token: only digests are compared, each in constant time."""
    host: str | None = None
    """A host key's host: the agent of this host may use ``/v1/agents/<host>/*`` alone."""


@dataclass(frozen=True)
class Access:
    """The keys the API takes, and whether reads need one."""

    keys: tuple[Key, ...] = ()
    open_reads: bool = False

    def role_of(self, token: str | None) -> Role | None:
        """The highest role a token holds; None for no token or an unknown one. Every key
        is compared (no early exit), so the time taken says nothing of which matched."""
        return self.holder(token)[0]

    def holder(self, token: str | None) -> tuple[Role | None, str | None]:
        """The highest role a token holds, and the host it is a host key of (each None
        where it holds none). Every key is compared (no early exit), so the time taken
        says nothing of which matched."""
        if not token:
            return None, None
        presented = digest(token)
        found: Role | None = None
        host: str | None = None
        for key in self.keys:
            if not hmac.compare_digest(presented, key.sha256):
                continue
            if key.role is not None and (found is None or grants(key.role, found)):
                found = key.role
            if key.host is not None:
                host = key.host
        return found, host

    def with_token(self, token: str, role: Role = "admin", name: str = "daemon") -> Access:
        """These keys and one more (the daemon's own token, for its in-process clients)."""
        return replace(self, keys=(*self.keys, Key(name, role, digest(token))))

    @classmethod
    def load(cls, path: str | Path) -> Access:
        """An access file (module docstring); AccessError naming the file and the key."""
        try:
            data = read_toml(path)
        except (OSError, TomlError) as exc:
            raise AccessError(f"access file {path}: {exc or type(exc).__name__}; see "
                              "docs/daemon.md (Access) for its format") from None
        return cls.parse(data, str(path))

    @classmethod
    def parse(cls, data: dict[str, Any], where: str) -> Access:
        unknown = set(data) - {"open_reads", "key"}
        if unknown:
            raise AccessError(f"access file {where}: unknown setting(s) "
                              f"{', '.join(sorted(unknown))}; expected open_reads and "
                              "[[key]] tables")
        open_reads = data.get("open_reads", False)
        if not isinstance(open_reads, bool):
            raise AccessError(f"access file {where}: open_reads must be true or false")
        entries = data.get("key", [])
        if not isinstance(entries, list) or not entries:
            raise AccessError(f"access file {where}: no [[key]] tables; give each key a "
                              "role and a token or a sha256")
        return cls(tuple(_key(entry, i, where) for i, entry in enumerate(entries, 1)),
                   open_reads)


def _key(entry: Any, number: int, where: str) -> Key:
    if not isinstance(entry, dict):
        raise AccessError(f"access file {where}: key {number} is not a table")
    name = entry.get("name", f"key {number}")
    at = f"access file {where}, key {name!r}"
    unknown = set(entry) - {"name", "role", "host", "token", "sha256"}
    if unknown:
        raise AccessError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}; expected "
                          "name, role or host, and token or sha256")
    if not isinstance(name, str):
        raise AccessError(f"{at}: name must be a string")
    role, host = entry.get("role"), entry.get("host")
    if host is not None:
        if role is not None:
            raise AccessError(f"{at}: give a role or a host, not both (a host key may use "
                              "its host's /v1/agents/HOST/* routes and nothing else)")
        if not isinstance(host, str) or ID.fullmatch(host) is None:
            raise AccessError(f"{at}: host must be a host id of the lab file (a letter, "
                              "then up to 63 letters, digits, '_', '.' or '-')")
    elif role not in ROLES:
        raise AccessError(f"{at}: role must be one of {', '.join(ROLES)}, not {role!r} "
                          "(or give host = \"HOST\" for a host's agent)")
    token, hexdigest = entry.get("token"), entry.get("sha256")
    if (token is None) == (hexdigest is None):
        raise AccessError(f"{at}: give exactly one of token and sha256")
    if token is not None:
        if not isinstance(token, str) or len(token) < 16:
            raise AccessError(f"{at}: token must be a string of 16 characters or more")
        return Key(name, role, digest(token), host)
    try:
        raw = bytes.fromhex(hexdigest) if isinstance(hexdigest, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != hashlib.sha256().digest_size:
        raise AccessError(f"{at}: sha256 must be 64 hex digits (printf %s TOKEN | sha256sum)")
    return Key(name, role, raw, host)


@dataclass(frozen=True)
class ApiSettings:
    """How the API meets the network: who may do what, how large a body may be, and the
    certificate it serves HTTPS with (none: plain HTTP)."""

    access: Access | None = None
    """None: the daemon's one token, admin; reads need it unless ``open_reads``."""
    open_reads: bool = False
    max_body: int = DEFAULT_MAX_BODY
    tls_cert: str | None = None
    tls_key: str | None = None
    open_metrics: bool = True
    """``GET /metrics`` without a key (as Prometheus scrapes by default); False: it needs a
    viewer's key like every other read."""

    def __post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise AccessError("HTTPS needs both a certificate and its key (--tls-cert and "
                              "--tls-key)")
        if self.max_body < 0:
            raise AccessError("the body limit cannot be negative")
        if self.tls_cert is not None and self.tls_key is not None:
            # Read now: a certificate that cannot be used is a message at start, not a
            # server that fails once the daemon has opened every instrument.
            try:
                ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                    self.tls_cert, self.tls_key)
            except (OSError, ssl.SSLError) as exc:
                raise AccessError(f"cannot serve HTTPS with certificate {self.tls_cert} and "
                                  f"key {self.tls_key}: {exc}") from None

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def reads_open(self) -> bool:
        return self.open_reads or (self.access is not None and self.access.open_reads)


def beyond_loopback(host: str) -> bool:
    """Whether an address a server binds to (the API, a broker's listener) can be reached
    from another machine."""
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host).is_loopback
    except ValueError:
        return True  # a name: whatever it resolves to, assume the network
