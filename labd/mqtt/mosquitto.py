"""Mosquitto's password and ACL files for a lab: each identity logs in with its own password
and may publish only on its own topics, so a host cannot speak for another host, and only
the daemon can say what the daemon says. (Where the broker is not Mosquitto, the ACL reads
as a plain statement of who may do what.)

Identities: ``<root>.daemon``, ``<root>.host.<host>`` and ``<root>.client.<name>``, where
``<root>`` is the lab, or ``<lab>@<instance>``.
"""

from __future__ import annotations

import base64
import hashlib
import secrets
from collections.abc import Iterable

from labd.errors import BusError
from labd.lab.limits import ID

#: Mosquitto 2's own password hash: PBKDF2-SHA512 (``$7$``), its default iteration count.
ITERATIONS = 101


def check_name(kind: str, name: str) -> str:
    """``name`` if it may name a host or client: it becomes a file name, a login and an ACL
    line, where a '/' or a newline would reach another file or add lines of its own."""
    if ID.fullmatch(name) is None:
        raise BusError(f"{kind} name {name[:40]!r} cannot be used: a name is a letter, then "
                       "up to 63 letters, digits, '_', '.' or '-'")
    return name


def identity(root: str, kind: str, name: str = "") -> str:
    """The broker login of the daemon, a host or a client of a lab root."""
    return f"{root}.{kind}" + (f".{check_name(kind, name)}" if name else "")


def password_line(username: str, password: str) -> str:
    """One line of a Mosquitto password file (what ``mosquitto_passwd`` writes)."""
    salt = secrets.token_bytes(12)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, ITERATIONS)
    return (f"{username}:$7${ITERATIONS}${base64.b64encode(salt).decode()}$"
            f"{base64.b64encode(digest).decode()}")


def acl(topic_root: str, login_root: str, hosts: Iterable[str],
        clients: Iterable[str]) -> str:
    """The ACL: the daemon owns the lab's topics; each host writes only its own status,
    heartbeats and events and reads only its own commands; clients send switch commands and
    read the daemon's results, events and state."""
    r = topic_root
    lines = ["# labd: who may publish and read what (labd broker-config)", "",
             f"user {identity(login_root, 'daemon')}", f"topic readwrite {r}/#", ""]
    for host in sorted(hosts):
        mine = f"{r}/hosts/{host}"
        lines += [f"user {identity(login_root, 'host', host)}",
                  *(f"topic write {mine}/{kind}" for kind in ("status", "heartbeat", "events")),
                  f"topic read {mine}/job", f"topic read {r}/daemon", ""]
    for client in sorted(clients):
        lines += [f"user {identity(login_root, 'client', client)}",
                  f"topic write {r}/command/+", f"topic read {r}/command/+/result",
                  f"topic read {r}/events/#", f"topic read {r}/state/#",
                  f"topic read {r}/daemon", ""]
    return "\n".join(lines)


def config(port: int, bind: str | None, passwd: str, acl_file: str,
           tls: tuple[str, str] | None = None) -> str:
    """A listener on ``bind`` (None: every interface) that takes only the lab's identities,
    over TLS where ``tls`` gives the broker's certificate and key files."""
    return "\n".join([
        "# labd: a listener for the lab's identities only (labd broker-config)",
        f"listener {port}" + (f" {bind}" if bind else ""),
        "allow_anonymous false", f"password_file {passwd}", f"acl_file {acl_file}",
        *([f"certfile {tls[0]}", f"keyfile {tls[1]}"] if tls else []),
        # A small message right behind another would wait for the subscriber's delayed ACK
        # (Nagle's algorithm, up to 40 ms), which shows in failure detection.
        "set_tcp_nodelay true", ""])
