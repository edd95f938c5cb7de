"""labd's pytest plugin (labd.testing, docs/hil.md) as a user's project meets it: a test
file of their own, run by pytest in a process of its own (where the plugin comes from the
installed package's entry point), against the emulated lab the plugin starts, and unchanged
against a "real" lab: instruments at the addresses of a ``labd emulate`` process started
apart, which to labd look like hardware."""

from __future__ import annotations

import asyncio
import tomllib
from importlib.metadata import entry_points

import pytest
import tomli_w

from labd import deadlines
from labd.client.control import spawn_emulators
from labd.lab.loader import resolve_lab_path
from labd.testing.plugin import lab_of
from labd.testing.selection import select

pytest_plugins = ["pytester"]

#: A user's tests: written for the demo lab, in pytest-asyncio's default (strict) mode.
USER_TESTS = '''
import httpx
import pytest


@pytest.mark.asyncio
async def test_make_a_circuit_and_read_it_back(labd_client):
    made = await labd_client.post("/v1/circuits", {"from": "h0.nic0", "to": "h1.nic0"})
    assert [r["outcome"] for r in made["reconfigurations"]] == ["ok"]
    circuits = await labd_client.get("/v1/circuits")
    assert [(c["from"], c["to"]) for c in circuits] == [("h0.nic0", "h1.nic0")]
    assert [[1, 18]] == (await labd_client.get("/v1/switches/ocs1"))["observed"]
    # Left up: the plugin takes it down after the test.


@pytest.mark.asyncio
async def test_the_light_reaches_the_receivers_tap(labd_client):
    await labd_client.post("/v1/circuits", {"from": "h0.nic0", "to": "h1.nic0"})
    now = await labd_client.read_power("pm1", [2])      # ocs1:18, h1's receiver, tapped
    assert now["channels"]["2"][0] > -40
    series = await labd_client.read_power("pm1", [2], points=20, interval_s=0.001)
    assert len(series["channels"]["2"]) == 20 and min(series["channels"]["2"]) > -40


@pytest.mark.asyncio
async def test_a_failed_port_refuses_the_change(labd_client, labd_emulators):
    await labd_emulators.inject("ocs1", {"kind": "fail_port", "port": 2})
    result = await labd_client.post("/v1/switches/ocs1/connections", {"pairs": [[2, 19]]})
    assert result["outcome"] == "failed" and result["error"], result
    truth = await labd_emulators.truth("ocs1")
    assert [2, 19] not in truth["state"]["connections"]


@pytest.mark.asyncio
async def test_the_next_test_finds_the_lab_as_it_was(labd_client):
    assert await labd_client.get("/v1/circuits") == []
    ports = await labd_client.get("/v1/switches/ocs1/ports")
    assert ports[1]["port"] == 2 and ports[1]["state"] == "enabled"


@pytest.mark.asyncio
@pytest.mark.labd_emulated
async def test_needs_emulation_without_the_fixture(labd_daemon, labd_client):
    assert labd_daemon.emulated and labd_daemon.control_url


def test_a_plain_test_reads_the_daemon(labd_daemon, labd_lab):
    health = httpx.get(labd_daemon.url + "/v1/health",
                       headers={"Authorization": f"Bearer {labd_daemon.token}"}).json()
    assert health["lab"] == labd_lab.lab.name == "demo"
'''

#: The project's own test plugins, which a user's project does not load (they only add
#: seconds to each run's start).
NOT_THE_USERS = ["-p", "no:hypothesispytest", "-p", "no:schemathesis",
                 "-p", "no:textual-snapshot", "-p", "no:syrupy", "-p", "no:cacheprovider"]


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A user's project: their test file and an ini that sets nothing of labd's."""
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    pytester.makepyfile(test_rack=USER_TESTS)
    return pytester


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*NOT_THE_USERS, "-rs", *args,
                                         timeout=deadlines.current().times(120))


def test_installing_labd_registers_the_plugin() -> None:
    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert found.get("labd") == "labd.testing.plugin", (
        "the entry point is missing: reinstall labd (pip install -e .)")


def test_the_users_tests_pass_on_the_emulated_lab(project: pytest.Pytester) -> None:
    result = run(project)
    result.stdout.fnmatch_lines(["labd: lab demo (emulated; from the default)"])
    result.assert_outcomes(passed=6)


async def test_the_same_tests_run_on_a_real_lab(project: pytest.Pytester,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """``--labd-lab FILE``: the daemon on instruments at FILE's addresses (here a ``labd
    emulate`` process, which the plugin knows nothing of); what needs emulation is skipped,
    saying why."""
    monkeypatch.setenv("COLUMNS", "400")  # each test's line with its whole reason
    emulators = await spawn_emulators("demo")
    try:
        rack = project.path / "rack.toml"
        data = tomllib.loads(resolve_lab_path("demo").read_text(encoding="utf-8"))
        for item in data["instrument"]:
            item["address"], item["emulate"] = emulators.endpoints[item["id"]], False
        rack.write_text(tomli_w.dumps(data), encoding="utf-8")
        # In a thread: this loop keeps reading the emulators' output meanwhile.
        result = await asyncio.to_thread(run, project, "-v", "--labd-lab", "rack.toml")
    finally:
        await emulators.stop()
    result.stdout.fnmatch_lines([f"labd: lab {rack} (real hardware, no emulation; "
                                 "from --labd-lab)"])
    result.assert_outcomes(passed=4, skipped=2)
    result.stdout.fnmatch_lines([
        "*::test_a_failed_port_refuses_the_change SKIPPED (needs the emulators' control "
        "endpoint (fault injection, ground truth); --labd-lab runs on real hardware)*",
        "*::test_needs_emulation_without_the_fixture SKIPPED (needs the emulators' control "
        "endpoint*"])


def test_the_ini_names_the_lab_to_emulate(pytester: pytest.Pytester) -> None:
    (pytester.path / "labs").mkdir()
    (pytester.path / "labs" / "bench.toml").write_text(
        '[lab]\nname = "bench"\n\n[[instrument]]\nid = "sw"\ndriver = "polatis-scpi"\n'
        'emulate = true\nsize = "4x4"\n', encoding="utf-8")
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n"
                     "labd_lab = labs/bench.toml\n")
    config = pytester.parseconfigure()
    assert not select(config).real
    assert lab_of(config).lab.name == "bench"
    assert select(config).describe() == (f"labd: lab {pytester.path / 'labs' / 'bench.toml'} "
                                         "(emulated; from ini labd_lab)")


def test_a_real_lab_with_emulated_instruments_is_refused(project: pytest.Pytester) -> None:
    demo = resolve_lab_path("demo")
    result = run(project, "--labd-lab", str(demo))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*--labd-lab {demo}: runs on real hardware, but the file "
                                 "marks ocs1, ocs2, ocs3, mesh1, pm1, pm2 for emulation*"])
