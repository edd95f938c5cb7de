"""The API's parts on their own: the table of routes the clients rely on, and the span
statistics of ``GET /v1/reconfigurations/stats`` against the other reports of labd."""

import random
from pathlib import Path

import numpy as np
import pytest

from labd import __version__
from labd.daemon.api.app import create_app
from labd.daemon.api.reconfigurations import span_stats
from labd.daemon.core import Daemon
from labd.lab.loader import load_lab
from labd.measure.campaign import summary
from labd.vocabulary import PHASES, SPANS
from tests.labs import write_lab

#: Every route of the API, as the CLI, the TUI, the agents and scripts call them.
ROUTES = {
    ("GET", "/v1/health"), ("GET", "/v1/instruments"), ("GET", "/v1/instruments/{instrument}"),
    ("GET", "/v1/hosts"), ("POST", "/v1/agents/{host}/{kind}"),
    ("GET", "/v1/agents/{host}/commands"),
    ("GET", "/v1/switches/{switch}"), ("GET", "/v1/switches/{switch}/ports"),
    ("POST", "/v1/switches/{switch}/connections"), ("PUT", "/v1/switches/{switch}/connections"),
    ("POST", "/v1/switches/{switch}/disconnect"),
    ("GET", "/v1/circuits"), ("POST", "/v1/circuits"), ("POST", "/v1/circuits/disconnect"),
    ("GET", "/v1/circuits/plan"), ("GET", "/v1/endpoints"),
    ("GET", "/v1/jobs"), ("GET", "/v1/jobs/{job}"), ("POST", "/v1/jobs/{job}/circuits"),
    ("POST", "/v1/jobs/{job}/start"), ("POST", "/v1/jobs/{job}/stop"),
    ("POST", "/v1/jobs/{job}/spares"), ("POST", "/v1/jobs/{job}/decision"),
    ("POST", "/v1/drills/failover"), ("GET", "/v1/drills"),
    ("GET", "/v1/failovers"), ("GET", "/v1/failovers/{failover}"),
    ("GET", "/v1/reconfigurations"), ("GET", "/v1/reconfigurations/{reconfiguration}/traces"),
    ("GET", "/v1/reconfigurations/stats"),
    ("GET", "/v1/meters"), ("GET", "/v1/meters/{meter}"), ("POST", "/v1/meters/{meter}/read"),
    ("GET", "/v1/holds"), ("POST", "/v1/holds"), ("PUT", "/v1/holds/{hold}"),
    ("DELETE", "/v1/holds/{hold}"),
}
#: The routes that change something, and the role each needs; every other one is a read
#: (viewer). An agent's routes need an admin key or the host's own key.
OPERATOR = {(m, p) for m, p in ROUTES if m in ("POST", "PUT", "DELETE") and p.startswith(
    ("/v1/switches", "/v1/circuits", "/v1/holds"))}
AGENT = {(m, p) for m, p in ROUTES if p.startswith("/v1/agents")}
ADMIN = {(m, p) for m, p in ROUTES if m == "POST" and p.startswith(("/v1/jobs", "/v1/drills"))
         } | AGENT


def test_the_route_table(tmp_path: Path) -> None:
    _, path = write_lab(tmp_path, "routes")
    daemon = Daemon(load_lab(path), db=str(tmp_path / "s.sqlite"), port=0, token="t")
    schema = create_app(daemon.services).openapi()
    assert (schema["info"]["title"], schema["info"]["version"]) == ("labd", __version__)
    operations = {(method.upper(), p): op for p, item in schema["paths"].items()
                  for method, op in item.items()}
    assert set(operations) == ROUTES
    roles = {key: op["x-labd-role"] for key, op in operations.items()}
    assert {key for key, role in roles.items() if role == "operator"} == OPERATOR
    assert {key for key, role in roles.items() if role == "admin"} == ADMIN
    assert {key for key, op in operations.items() if op.get("x-labd-host") == "host"} == AGENT
    assert all(op["security"] == [{"bearer": []}] and {"401", "403"} <= set(op["responses"])
               for op in operations.values())
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "202" in operations["POST", "/v1/drills/failover"]["responses"]
    assert "202" in operations["POST", "/v1/agents/{host}/{kind}"]["responses"]


def history(seed: int) -> list[dict[str, object]]:
    """Reconfiguration rows as ``GET /v1/reconfigurations`` lists them, on two switches; a
    third of them never saw light (no meter on the path)."""
    rng = random.Random(seed)
    rows = []
    for i in range(61):
        at = rng.randrange(10**12)
        phases: dict[str, int | None] = {}
        for phase in PHASES:
            at += rng.randrange(1, 9_000_000)
            phases[phase] = at
        if i % 3 == 0:
            phases["light"] = None
        rows.append({"switch": "ocs1" if i % 4 else "ocs2", "k": 1, "outcome": "ok",
                     "phases": phases})
    return rows


def test_span_stats_agree_with_numpy_and_labd_measure() -> None:
    rows = history(seed=11)
    stats = span_stats(rows)
    assert list(stats) == ["ocs1", "ocs2"]
    measured = {(s["switch"], s["span"]): s for s in summary(rows)}  # labd measure's
    for switch in ("ocs1", "ocs2"):
        mine = [r for r in rows if r["switch"] == switch]
        assert stats[switch]["count"] == len(mine)
        for span, start, end in SPANS:
            values = [p[end] - p[start] for r in mine  # type: ignore[index]
                      if (p := r["phases"])[start] is not None and p[end] is not None]
            got = stats[switch][span]
            assert got["n"] == len(values) == measured[switch, span]["n"]
            for q in (50, 99):
                assert got[f"p{q}_ms"] == pytest.approx(np.percentile(values, q) / 1e6,
                                                        rel=1e-12)
                assert got[f"p{q}_ms"] == pytest.approx(measured[switch, span][f"p{q}"],
                                                        rel=1e-12)
    assert stats["ocs2"]["light"]["n"] < stats["ocs2"]["count"]  # the dark ones left out


def test_span_stats_of_a_span_no_row_reached() -> None:
    phases = dict.fromkeys(PHASES, 5) | {"light": None, "activated": None}
    stats = span_stats([{"switch": "s", "phases": phases}])
    assert stats["s"]["count"] == 1
    assert stats["s"]["light"] == {"n": 0, "p50_ms": None, "p99_ms": None}
    assert stats["s"]["switching"] == {"n": 0, "p50_ms": None, "p99_ms": None}
    assert stats["s"]["total"] == {"n": 1, "p50_ms": 0.0, "p99_ms": 0.0}
    assert span_stats([]) == {}
