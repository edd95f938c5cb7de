"""``labd fleet``: two pods, each leading from its own database on one PostgreSQL server,
found by the server's databases and asked through their APIs."""

from __future__ import annotations

import json
from pathlib import Path

from labd.emulation.rig import emulated_rig
from labd.ha.role import HaSettings
from labd.lab.loader import load_lab
from tests.commands.test_cli import run
from tests.databases import PG, postgres_database
from tests.labs import endpoint, host, job, switch, unique_name, write_lab


async def test_fleet_lists_every_pod_its_leader_hosts_and_spares(tmp_path: Path) -> None:
    names = [unique_name("pod"), unique_name("pod")]
    key = tmp_path / "key"
    key.write_text("tok\n")
    key.chmod(0o600)
    labs = []
    for index, name in enumerate(names):
        folder = tmp_path / name
        folder.mkdir()
        hosts = [f"h{index}{n}" for n in range(3)]
        parts = [switch(), *(endpoint(f"{h}.nic0") for h in hosts),
                 *(host(h) for h in hosts),
                 job("j", [f"{h}.nic0" for h in hosts[:2]], spares=[f"{hosts[2]}.nic0"])]
        labs.append(load_lab(write_lab(folder, "pod", *parts, name=name)[1]))
    with postgres_database() as first_db, postgres_database() as second_db:
        async with emulated_rig(labs[0], db=first_db, token="tok",
                                ha=HaSettings(first_db)) as first, \
                emulated_rig(labs[1], db=second_db, token="tok",
                             ha=HaSettings(second_db)) as second:
            code, out, err = await run("fleet", "--server", PG, "--token-file", str(key),
                                       "--json")
            assert code == 0, out + err
            pods = {pod["lab"]: pod for pod in json.loads(out)}
            for name, rig, db in ((names[0], first, first_db), (names[1], second, second_db)):
                pod = pods[name]
                assert pod["leads"] and pod["url"] == rig.daemon.url, pod
                assert pod["database"] == db.rsplit("/", 1)[-1] and pod["problem"] is None
                assert sum(pod["hosts"].values()) == 3
                assert [(j["id"], len(j["spares"])) for j in pod["jobs"]] == [("j", 1)]
            code, out, err = await run("fleet", "--server", PG, "--token-file", str(key))
            assert code == 0 and all(name in out for name in names), out + err


async def test_a_server_that_does_not_answer_is_one_line(tmp_path: Path) -> None:
    code, out, err = await run("fleet", "--server",
                               "postgresql://postgres:s3cret@127.0.0.1:1/postgres")
    assert code == 2 and "cannot list the pods" in out + err
    assert "Traceback" not in out + err and "s3cret" not in out + err  # never the password
    code, out, err = await run("fleet", "--server", PG, "--token-file",
                               str(tmp_path / "nosuch"))
    assert code == 2 and "nosuch" in out + err and "Traceback" not in out + err
