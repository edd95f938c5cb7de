"""The pytest plugin (docs/hil.md), registered by installing labd
(``[project.entry-points.pytest11] labd = "labd.testing.plugin"``; ``-p no:labd`` turns it
off).

Fixtures:

- ``labd_lab`` (session): the lab file, parsed (labd.lab.loader.Lab);
- ``labd_daemon`` (session): a daemon on it (labd.testing.running.LabdDaemon: url, token,
  addresses), with the lab's emulators unless ``--labd-lab`` names a real lab;
- ``labd_client`` (function): labd.client.api.DaemonClient on it, on the test's loop
  (its ``read_power`` reads a meter through the daemon);
- ``labd_emulators`` (function): the emulators' control endpoint
  (labd.testing.clients.Emulators: faults, ground truth); a test that asks for it is
  skipped on a real lab, as is one marked ``labd_emulated``.

After each test that used ``labd_client`` or ``labd_emulators``, what it changed is put
back (labd.testing.clients.LabState). Importing this module costs nothing beyond pytest:
labd's own modules load when a test first asks for the lab.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING

import pytest

from labd.testing.selection import REAL_LAB_SKIP, lab_of, select

if TYPE_CHECKING:
    from labd.client.api import DaemonClient
    from labd.lab.loader import Lab
    from labd.testing.clients import Emulators
    from labd.testing.running import LabdDaemon, LabThread

try:
    import pytest_asyncio
except ImportError:  # the async fixtures say what is missing when asked for
    pytest_asyncio = None  # type: ignore[assignment]

__all__ = ["REAL_LAB_SKIP", "lab_of"]

MARKER = "labd_emulated"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("labd", "labd hardware-in-the-loop (docs/hil.md)")
    group.addoption("--labd-lab", dest="labd_lab", metavar="FILE", default=None,
                    help="run against the real lab FILE describes (every instrument at its "
                         "address, emulate = false): no emulators; tests that need them "
                         "are skipped")
    parser.addini("labd_lab", default="",
                  help="the lab the labd fixtures emulate: a lab file (relative to the "
                       "ini file) or a packaged lab's name (default: demo)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: the test needs the lab's emulators (fault injection, ground "
                   "truth); skipped with --labd-lab")
    if select(config).real:
        lab_of(config)  # a real lab file that cannot be used stops the run here


def pytest_report_header(config: pytest.Config) -> str:
    return select(config).describe()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a real lab, skip what needs the emulators before anything starts for it."""
    if not select(config).real:
        return
    skip = pytest.mark.skip(reason=REAL_LAB_SKIP)
    for item in items:
        if item.get_closest_marker(MARKER) is not None or "labd_emulators" in getattr(
                item, "fixturenames", ()):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def labd_lab(pytestconfig: pytest.Config) -> Lab:
    """The session's lab file, parsed: ``--labd-lab FILE`` (real), else the ini setting
    ``labd_lab``, else the packaged demo lab (both emulated)."""
    return lab_of(pytestconfig)


@pytest.fixture(scope="session")
def _labd_running(labd_lab: Lab, pytestconfig: pytest.Config,
                  tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabThread]:
    from labd.testing.running import LabThread

    served = LabThread(labd_lab, emulate=not select(pytestconfig).real,
                       workdir=tmp_path_factory.mktemp("labd"))
    served.start()  # returns once the daemon listens; RuntimeError says why it did not
    try:
        yield served
    finally:
        served.stop()


@pytest.fixture(scope="session")
def labd_daemon(_labd_running: LabThread) -> LabdDaemon:
    """The daemon the session's tests share, on the lab's emulators (or the real lab),
    served from a thread of its own: ``url``, ``token`` (admin), ``addresses``,
    ``emulated``; ``client()`` and ``emulators()`` make clients for any event loop."""
    import warnings

    daemon = _labd_running.daemon
    if daemon.failed and not daemon.emulated:
        warnings.warn(pytest.PytestWarning(
            "labd: instruments that did not answer at start-up (the daemon keeps trying): "
            + "; ".join(f"{k}: {v}" for k, v in daemon.failed.items())), stacklevel=1)
    return daemon


def _need_asyncio() -> None:
    pytest.fail("labd_client and labd_emulators are async: install pytest-asyncio "
                "(pip install pytest-asyncio; docs/hil.md)", pytrace=False)


if pytest_asyncio is not None:
    @pytest_asyncio.fixture
    async def _labd_test(labd_daemon: LabdDaemon, _labd_running: LabThread
                         ) -> AsyncIterator[tuple[DaemonClient, Emulators | None]]:
        """One test's clients, on its loop; the lab's state read before it and put back
        after it."""
        from labd.testing.clients import LabState

        _labd_running.check()
        client = labd_daemon.client()
        emulators = labd_daemon.emulators() if labd_daemon.emulated else None
        try:
            before = await LabState.read(client, emulators)
            yield client, emulators
            await before.put_back(client, emulators)
        finally:
            await client.close()
            if emulators is not None:
                await emulators.close()
else:
    @pytest.fixture
    def _labd_test() -> None:
        _need_asyncio()


@pytest.fixture
def labd_client(_labd_test: tuple[DaemonClient, Emulators | None]) -> DaemonClient:
    """The daemon's API (labd.client.api.DaemonClient, admin key) on the test's loop:
    ``await labd_client.get("/v1/circuits")``, ``.post``, ``.put``, ``.events()``; a
    meter read now, one channel, all or a series: ``.read_power("pm1", [2])``,
    ``.read_power("pm1", points=100, interval_s=1e-3)``."""
    return _labd_test[0]


@pytest.fixture
def labd_emulators(labd_daemon: LabdDaemon,
                   _labd_test: tuple[DaemonClient, Emulators | None]) -> Emulators:
    """The emulators' control endpoint (labd.testing.clients.Emulators): ``inject``,
    ``clear_faults``, ``truth``, ``light``, ``set_timing``, ``power``, ``addresses``.
    Skipped on a real lab (``--labd-lab``)."""
    emulators = _labd_test[1]
    if emulators is None:
        pytest.skip(REAL_LAB_SKIP)
    return emulators
