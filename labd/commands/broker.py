"""``labd broker-config``: a lab's MQTT identities, written once: Mosquitto's password and
ACL files, and one credentials file for the daemon, each host and each client."""

from __future__ import annotations

import ipaddress
import re
import secrets
from pathlib import Path
from typing import Annotated

import typer

from labd.commands.common import console, err_console, fail, load
from labd.errors import BusError

#: Where a plain (non-TLS) listener listens unless --bind says otherwise: passwords and
#: messages in clear stay on this machine.
LOOPBACK = "127.0.0.1"
#: A host name --bind may give (it goes into a mosquitto.conf line as it is).
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")


def bind_address(value: str) -> str:
    """``value`` if a listener may be bound to it: an IP address or a host name."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        if HOST_NAME.fullmatch(value) is None:
            raise fail(f"--bind {value[:60]!r}: expected an IP address (127.0.0.1, 0.0.0.0, "
                       "::) or a host name") from None
        return value


def broker_config(
    lab: Annotated[str, typer.Argument(help="Lab file path, or a packaged lab name.")],
    out: Annotated[Path, typer.Option(help="Folder to write the files into.")] = Path("mqtt"),
    instance: Annotated[str, typer.Option(
        help="The lab instance whose topics these are (labd run --instance).")] = "",
    client: Annotated[list[str] | None, typer.Option(
        help="A client allowed to send switch commands over MQTT (repeatable): a letter, "
             "then letters, digits, '_', '.' or '-'.")] = None,
    port: Annotated[int | None, typer.Option(
        min=1, max=65535, help="The listener port in mosquitto.conf (default: 1883, or 8883 "
                               "with TLS).")] = None,
    bind: Annotated[str | None, typer.Option(
        metavar="ADDRESS",
        help="The address the listener listens on (default: 127.0.0.1 for a plain listener, "
             "every interface with TLS); a plain listener beyond loopback is written with a "
             "warning: passwords and messages would cross the network in clear.")] = None,
    tls_cert: Annotated[Path | None, typer.Option(
        help="The broker's certificate (PEM): the listener takes TLS only (mqtts://).")] = None,
    tls_key: Annotated[Path | None, typer.Option(
        help="The private key of --tls-cert (PEM).")] = None,
    tls_ca: Annotated[Path | None, typer.Option(
        help="The CA that signed --tls-cert, for every credentials file (default: clients "
             "trust the system's CAs).")] = None,
    rotate: Annotated[bool, typer.Option(
        help="Make new keys and passwords for everyone (default: keep those in OUT).")]
    = False,
) -> None:
    """Write a lab's MQTT identities into OUT: `mosquitto.conf`, `passwd` and `acl` for the
    broker (anonymous clients refused; each host may publish only under its own topics),
    `daemon.toml` for `labd run --mqtt-credentials`, `hosts/HOST.toml` for each host's
    `labd agent --mqtt-credentials` and `clients/NAME.toml` for each client. Every message
    a host or client sends is also signed with its key, so a spoofed or replayed message
    changes nothing even on an open broker. Files holding secrets are created mode 0600. A plain
    listener listens on 127.0.0.1 only, unless --bind says otherwise."""
    from labd.daemon.access import beyond_loopback
    from labd.files import write_private
    from labd.mqtt.credentials import Credentials, read_credentials
    from labd.mqtt.envelope import new_key
    from labd.mqtt.mosquitto import acl, check_name, config, identity, password_line
    from labd.mqtt.topics import lab_root

    if (tls_cert is None) != (tls_key is None):
        raise fail("--tls-cert and --tls-key go together: the broker needs both")
    if tls_ca is not None and tls_cert is None:
        raise fail("--tls-ca is for a TLS listener: give --tls-cert and --tls-key too")
    for given in (tls_cert, tls_key, tls_ca):
        if given is not None and not given.is_file():
            raise fail(f"{given}: no such file")
    tls = {"ca": str(tls_ca.resolve())} if tls_ca is not None else {}
    port = port or (8883 if tls_cert else 1883)
    listen = bind_address(bind) if bind is not None else (None if tls_cert else LOOPBACK)
    loaded = load(lab)
    name = loaded.lab.name
    try:
        topic_root = lab_root(name, instance)
    except BusError as exc:
        raise fail(str(exc)) from None
    login_root = topic_root.removeprefix("labd/")
    clients = client or ["operator"]
    try:
        for name_given in clients:
            check_name("--client", name_given)
    except BusError as exc:
        raise fail(str(exc)) from None
    hosts = [h.id for h in loaded.host]

    def kept(path: Path) -> Credentials | None:
        if rotate or not path.exists():
            return None
        try:
            return read_credentials(path)
        except BusError as exc:
            raise fail(f"{exc} (or give --rotate to make new ones)") from None

    def one(path: Path, kind: str, who: str, keys: dict[str, bytes]) -> Credentials:
        before = kept(path)
        mine = dict(keys)
        if before is not None:  # an agent already deployed keeps working
            mine = {**mine, **{k: v for k, v in {**before.hosts, **before.clients}.items()
                               if k in mine}}
        username = identity(login_root, kind, who if kind != "daemon" else "")
        password = before.password if before and before.password else secrets.token_urlsafe(24)
        return Credentials(username, password, lab=name, instance=instance, tls=tls,
                           hosts=mine if kind == "host" else {},
                           clients=mine if kind == "client" else {})

    host_files = {h: one(out / "hosts" / f"{h}.toml", "host", h, {h: new_key()}) for h in hosts}
    client_files = {c: one(out / "clients" / f"{c}.toml", "client", c, {c: new_key()})
                    for c in clients}
    daemon_before = kept(out / "daemon.toml")
    daemon = Credentials(
        identity(login_root, "daemon"),
        daemon_before.password if daemon_before and daemon_before.password
        else secrets.token_urlsafe(24),
        hosts={h: c.hosts[h] for h, c in host_files.items()},
        clients={c: f.clients[c] for c, f in client_files.items()}, lab=name, instance=instance,
        tls=tls)

    note = f"labd MQTT credentials for lab {name!r}: secret, keep mode 0600"
    daemon.write(out / "daemon.toml", note=note)
    for h, creds in host_files.items():
        creds.write(out / "hosts" / f"{h}.toml", note=note)
    for c, creds in client_files.items():
        creds.write(out / "clients" / f"{c}.toml", note=note)
    logins = [daemon, *host_files.values(), *client_files.values()]
    write_private(out / "passwd", "\n".join(password_line(c.username or "", c.password or "")
                                            for c in logins) + "\n")
    (out / "acl").write_text(acl(topic_root, login_root, hosts, clients))
    server_tls = ((str(tls_cert.resolve()), str(tls_key.resolve()))
                  if tls_cert is not None and tls_key is not None else None)
    (out / "mosquitto.conf").write_text(config(
        port, listen, str((out / "passwd").resolve()), str((out / "acl").resolve()),
        server_tls))
    scheme = "mqtts" if server_tls else "mqtt"
    where = f"{listen or 'every interface'} port {port}"
    if server_tls is None and listen is not None and beyond_loopback(listen):
        err_console.print(f"[yellow]warning[/]: {out}/mosquitto.conf: a plain listener on "
                          f"{where}: passwords and messages cross the network in clear; give "
                          "--tls-cert and --tls-key", soft_wrap=True, highlight=False)
    console.print(f"[bold]labd broker-config[/]: lab [cyan]{name}[/], topics {topic_root}/..., "
                  f"written to {out}/")
    console.print(f"  broker:  mosquitto -c {out}/mosquitto.conf   (on {where}; passwd, acl: "
                  f"{len(logins)} identities; anonymous clients refused)")
    console.print(f"  daemon:  labd run LAB --mqtt {scheme}://BROKER:{port} "
                  f"--mqtt-credentials {out}/daemon.toml")
    console.print(f"  hosts:   labd agent ... --mqtt-credentials {out}/hosts/HOST.toml "
                  f"({len(hosts)} host(s))")
    console.print(f"  clients: {', '.join(f'{out}/clients/{c}.toml' for c in clients)}")
