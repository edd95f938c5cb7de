"""The Grafana dashboard on a daemon that has just started: each metric selector of each
panel's expression (and of the switch variable's query) matches a series of the first
scrape, so no panel of a new daemon reads "No data"; and every instrument, switch and
failover stage of the lab has its series at zero."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import httpx
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from labd import __version__
from labd.build import commit
from labd.lab.entries import SWITCH_ENTRIES
from labd.vocabulary import SPANS, STAGES
from tests.broker import MQTT
from tests.labs import ring_lab

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "labd.json"

Sample = tuple[str, dict[str, str]]

#: What Grafana puts in a query before Prometheus sees it: a multi-value variable at "All"
#: becomes its allValue (".*"); the interval variables are inside a range, dropped below.
VARIABLES = {"$switch": ".*"}
#: PromQL's words that look like a metric name but are none.
KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right",
                      "bool", "and", "or", "unless", "offset", "inf", "nan"})
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Selector:
    """A PromQL instant-vector selector: a metric name and its label matchers."""

    name: str
    matchers: tuple[tuple[str, str, str], ...]

    def matches(self, sample: Sample) -> bool:
        name, labels = sample
        if name != self.name:
            return False
        for label, op, value in self.matchers:
            have = labels.get(label, "")
            if op in ("=", "!=") and (have == value) != (op == "="):
                return False
            if op in ("=~", "!~") and bool(re.fullmatch(value, have)) != (op == "=~"):
                return False
        return True


def selectors(expr: str) -> list[Selector]:
    """The metric selectors of a PromQL expression (no full parser: the dashboard's
    expressions use aggregations, functions, ranges, comparisons and label matchers)."""
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    # A variable's query: label_values(metric, label) reads the metric's series.
    expr = re.sub(rf"label_values\(\s*({NAME})\s*,\s*{NAME}\s*\)", r"\1", expr)
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges: [$__rate_interval], [5m]
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # label lists
    found = []
    position = 0
    token = re.compile(rf"{NAME}|\d+(?:\.\d*)?|\S")
    while (match := token.search(expr, position)) is not None:
        position = match.end()
        name = match.group()
        if not re.fullmatch(NAME, name) or name in KEYWORDS or \
                expr[position:].lstrip().startswith("("):
            continue  # a number, an operator, a function or aggregation, a keyword
        matchers: list[tuple[str, str, str]] = []
        rest = expr[position:]
        if rest.lstrip().startswith("{"):
            start = position + rest.index("{") + 1
            end = expr.index("}", start)
            body = expr[start:end]
            at = 0
            while body[at:].strip():
                part = MATCHER.match(body, at)
                assert part is not None, f"cannot read the matchers {body!r} of {expr!r}"
                matchers.append((part[1], part[2], part[3]))
                at = part.end()
            position = end + 1
        found.append(Selector(name, tuple(matchers)))
    return found


def dashboard_expressions() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    found = [target["expr"] for panel in board["panels"]
             for target in panel.get("targets", [])]
    found += [var["query"] for var in board["templating"]["list"] if var["type"] == "query"]
    return found


def scrape_samples(text: str) -> list[Sample]:
    return [(s.name, dict(s.labels)) for family in text_string_to_metric_families(text)
            for s in family.samples]


def test_selectors_are_read_from_expressions() -> None:
    expr = ('histogram_quantile(0.99, sum by (switch, le) (rate(labd_reconfiguration_'
            'seconds_bucket{phase="total", switch=~"$switch"}[$__rate_interval])))')
    assert selectors(expr) == [Selector("labd_reconfiguration_seconds_bucket", (
        ("phase", "=", "total"), ("switch", "=~", ".*")))]
    assert selectors("labd_instrument_state == 1") == [Selector("labd_instrument_state", ())]
    assert selectors("label_values(labd_reconfigurations_total, switch)") == [
        Selector("labd_reconfigurations_total", ())]
    assert selectors("sum by (source) (rate(labd_warnings_total[5m])) * 60") == [
        Selector("labd_warnings_total", ())]
    sample = ("m", {"phase": "total"})
    assert Selector("m", (("phase", "!=", "total"),)).matches(sample) is False
    assert Selector("m", (("phase", "=~", "to.*"),)).matches(sample) is True
    assert Selector("m", (("phase", "!~", "to"),)).matches(sample) is True


@given(st.from_regex(r"[a-z_]{1,12}", fullmatch=True),
       st.from_regex(r"[a-z]{1,8}", fullmatch=True),
       st.text(alphabet="abc.*", max_size=6))
def test_any_selector_reads_back(name: str, label: str, value: str) -> None:
    if name in KEYWORDS:
        return
    read = selectors(f'rate({name}{{{label}="{value}"}}[5m])')
    assert read == [Selector(name, ((label, "=", value),))]


async def test_every_dashboard_selector_has_a_series_on_a_fresh_daemon(start_rig) -> None:  # type: ignore[no-untyped-def]
    async with start_rig("fresh-dashboard", ring_lab(), mqtt=MQTT, token="t") as rig, \
            httpx.AsyncClient(base_url=rig.daemon.url) as http:
        response = await http.get("/metrics")
        lab = rig.daemon.lab
    assert response.status_code == 200
    samples = scrape_samples(response.text)
    expressions = dashboard_expressions()
    assert len(expressions) >= 25
    empty = [(expr, selector) for expr in expressions for selector in selectors(expr)
             if selector.name.startswith(("labd_", "process_", "python_"))
             and not any(selector.matches(sample) for sample in samples)]
    assert not empty, "no series for: " + "; ".join(
        f"{s.name}{dict((k, v) for k, _, v in s.matchers)} in {e!r}" for e, s in empty)

    def has(name: str, **labels: str) -> bool:
        return any(n == name and labels.items() <= have.items() for n, have in samples)

    switches = [e.id for e in lab.instrument if isinstance(e, SWITCH_ENTRIES)]
    assert switches
    for entry in lab.instrument:
        assert has("labd_instrument_reconnects_total", instrument=entry.id)
        assert has("labd_instrument_events_total", instrument=entry.id, kind="state")
    for name in switches:
        for span, _, _ in SPANS:
            assert has("labd_reconfiguration_seconds_bucket", switch=name, phase=span,
                       le="+Inf")
        assert has("labd_light_verifications_total", switch=name, result="missing")
    for stage in STAGES:
        assert has("labd_failover_stage_seconds_count", stage=stage)
    assert has("labd_build_info", version=__version__, commit=commit())
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total",
                 "process_open_fds", "python_info"):
        assert has(name), f"{name} is not exported"
    # At zero: nothing has happened yet.
    zero = {"labd_failovers_total", "labd_warnings_total", "labd_instrument_reconnects_total",
            "labd_failover_stage_seconds_count"}
    assert all(value == 0 for family in text_string_to_metric_families(response.text)
               for s in family.samples if s.name in zero
               for value in [s.value])
