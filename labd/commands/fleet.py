"""``labd fleet``: every pod led from one PostgreSQL server, its leader, hosts, jobs and
spares.

Pods that lead by a lease (``labd run --ha``) keep it in their own database: two pods must
not share one, since the store's rows are keyed by switch and job and a second lab's
``ocs1`` would take the first's (docs/scale.md, "A datacenter"). So the fleet is found by
asking the server for its databases and reading each one's lease rows; each leader is then
asked through its API, with one key for all.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table

from labd.commands.common import console, fail
from labd.errors import LabdError

#: Hosts asked for a page at a time (the API's largest page).
PAGE = 10_000
#: How long one leader may take to answer before its row says so.
ASK_S = 5.0


@dataclass
class Pod:
    """One lease row, and what its leader said (or why it said nothing)."""

    database: str
    lab: str
    holder: str
    url: str
    epoch: int
    expires_at: datetime
    leads: bool
    """Whether the lease was live when read (by the database's clock, as the lease is)."""
    hosts: dict[str, int] = field(default_factory=dict)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    problem: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"lab": self.lab, "database": self.database, "leader": self.holder,
                "url": self.url, "epoch": self.epoch, "leads": self.leads,
                "lease_expires": self.expires_at.isoformat(), "hosts": self.hosts,
                "jobs": [{k: j.get(k) for k in ("id", "status", "members", "spares")}
                         for j in self.jobs],
                "problem": self.problem}


def _shown(server: str) -> str:
    """The server's URL as it may be printed: without its password."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(server).render_as_string(hide_password=True)
    except ArgumentError:
        return server.split("@")[-1]


def leases(server: str) -> list[Pod]:
    """The lease rows of every database on the server that has them."""
    import sqlalchemy
    from sqlalchemy.engine import make_url

    base = make_url(server.replace("postgresql://", "postgresql+psycopg://", 1)
                    if server.startswith("postgresql://") else server)
    engine = sqlalchemy.create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            names = list(connection.scalars(sqlalchemy.text(
                "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate "
                "ORDER BY datname")))
    finally:
        engine.dispose()
    pods = []
    for name in names:
        engine = sqlalchemy.create_engine(base.set(database=name))
        try:
            with engine.connect() as connection:
                if not sqlalchemy.inspect(connection).has_table("leases"):
                    continue
                rows = connection.execute(sqlalchemy.text(
                    "SELECT name, holder, url, epoch, expires_at, expires_at > now() FROM leases "
                    "ORDER BY name"))
                pods += [Pod(name, *row) for row in rows]
        except sqlalchemy.exc.SQLAlchemyError:
            continue  # a database this user may not read is not a pod it can see
        finally:
            engine.dispose()
    return pods


async def ask(pod: Pod, token: str | None) -> None:
    """Fill in what the pod's leader says: its hosts by status, its jobs."""
    from labd.client.api import DaemonClient
    from labd.errors import DaemonError, LabdError

    if not pod.leads:
        pod.problem = "no leader: the lease has expired"
        return
    client = DaemonClient(pod.url, token)
    try:
        async with asyncio.timeout(ASK_S):
            for status in ("online", "offline", "lost", "unknown"):
                count, after = 0, None
                while True:
                    page = await client.get("/v1/hosts", status=status, limit=PAGE,
                                            **({"after": after} if after else {}))
                    if not isinstance(page, list) or not all(
                            isinstance(h, dict) and isinstance(h.get("id"), str)
                            for h in page):
                        raise DaemonError(f"{pod.url}: /v1/hosts is not a list of hosts")
                    count += len(page)
                    if len(page) < PAGE:
                        break
                    after = page[-1]["id"]
                pod.hosts[status] = count
            jobs = await client.get("/v1/jobs")
            if not isinstance(jobs, list) or not all(
                    isinstance(j, dict) and isinstance(j.get("id"), str) for j in jobs):
                raise DaemonError(f"{pod.url}: /v1/jobs is not a list of jobs")
            pod.jobs = jobs
    except TimeoutError:
        pod.problem = f"{pod.url} did not answer within {ASK_S:g} s"
    except (LabdError, OSError) as exc:
        pod.problem = str(exc)
    finally:
        with contextlib.suppress(Exception):
            await client.close()


def fleet(
    server: Annotated[str, typer.Option(
        help="The PostgreSQL server the pods lead from (a URL; its database part is "
             "ignored).")] = "postgresql://postgres@127.0.0.1:5432/postgres",
    token_file: Annotated[str | None, typer.Option(
        "--token-file", help="File holding a key every pod's daemon takes (default: "
                             "$LABD_TOKEN, else the token file).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON instead of a "
                                                          "table.")] = False,
    only: Annotated[list[str] | None, typer.Option(
        "--lab", help="Only this pod (its lab's name; repeat for more).")] = None,
) -> None:
    """Every pod led from one PostgreSQL server: its leader and lease, hosts by status,
    jobs with their members and spares. Pods run with --ha are found (their lease says who
    leads); each leader is asked through its API with the one key given, so the key goes
    to every URL a lease on that server names: trust who may write there, or name the
    pods (--lab)."""
    import json

    import sqlalchemy

    from labd.token import find_token

    shown = _shown(server)
    try:
        pods = leases(server)
    except (sqlalchemy.exc.SQLAlchemyError, ValueError) as exc:
        reason = str(exc).splitlines()[0].replace(server, shown)
        raise fail(f"cannot list the pods on {shown}: {reason}") from None
    if only:
        pods = [pod for pod in pods if pod.lab in only]
    try:
        token = find_token(file=token_file)
    except LabdError as exc:
        raise fail(str(exc)) from None

    async def ask_all() -> None:
        await asyncio.gather(*(ask(pod, token) for pod in pods))

    asyncio.run(ask_all())
    if json_out:
        print(json.dumps([pod.as_dict() for pod in pods], indent=2))
        return
    if not pods:
        console.print(f"no pod leads from {shown}: none of its databases holds a lease "
                      "(pods are found when they run with --ha)")
        return
    table = Table(title=f"pods leading from {shown}")
    for column in ("lab", "leader", "epoch", "hosts", "jobs", "spares"):
        table.add_column(column)
    for pod in pods:
        hosts = ", ".join(f"{n} {status}" for status, n in pod.hosts.items() if n) or "-"
        jobs = ", ".join(f"{j['id']} {j.get('status')}" for j in pod.jobs) or "-"
        spares = ", ".join(f"{j['id']}: {len(j.get('spares') or [])}" for j in pod.jobs)
        table.add_row(f"{pod.lab}\n[dim]{pod.database}[/]", f"{pod.holder}\n[dim]{pod.url}[/]",
                      str(pod.epoch), pod.problem or hosts, "" if pod.problem else jobs,
                      "" if pod.problem else spares or "-")
    console.print(table)
