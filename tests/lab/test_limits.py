"""The lab file's limits: each mistake a lab file was once accepted with, or answered with a
traceback, is a lab-file error naming the entry and field; and no input at all, text or
parsed TOML, gets anything else out of the loader (hypothesis)."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from emulators.lab import KINDS
from instruments.polatis_scpi import PolatisScpi
from instruments.switch import parse_size
from labd.emulation.emulators import EMULATION
from labd.errors import LabFileError
from labd.lab.limits import MAX_FILE_BYTES, MAX_PORTS_PER_SIDE
from labd.lab.loader import Lab, load_lab, packaged_labs, parse_lab, parse_text
from labd.lab.options import OPTIONS
from tests.labs import endpoint, fiber, host, instrument, switch

HEAD = '[lab]\nname = "limits"\n'
GOOD = (HEAD + switch(size="8x8") + switch("ocs2", size="8x8") + endpoint("a", 0)
        + endpoint("b") + fiber("a", "ocs1:1") + fiber("ocs1:9", "b"))


def refused(text: str) -> list[str]:
    with pytest.raises(LabFileError) as info:
        parse_text(text, "lab.toml")
    assert info.value.problems and all(p.startswith("lab.toml: ") for p in info.value.problems)
    return info.value.problems


def test_the_good_lab_loads() -> None:
    lab = parse_text(GOOD, "lab.toml")
    assert len(lab.fiber) == 2


@pytest.mark.parametrize(("size", "said"), [
    ("-16x16", "'-16x16': expected NxM with N and M whole numbers 1..4096"),
    ("99999999999x99999999999", "'99999999999x99999999999': expected NxM"),
    ("4097x16", "'4097x16'"),
    ("0x16", "'0x16'"),
    ("16x16 please", "'16x16 please'"),
    ("1" * 5000, "(5000 chars)"),
])
def test_a_switch_size_is_whole_and_bounded(size: str, said: str) -> None:
    (problem,) = refused(HEAD + switch(size=size))
    assert "[[instrument]] #1 (id 'ocs1'), field 'size'" in problem and said in problem


@pytest.mark.parametrize("size", ["-16x16", "16x16 ports", "x16x16", "99999999999x1", "0",
                                  "4097", "16x0", "\uff11\uff16x16", " "])
def test_the_drivers_take_sizes_as_strictly_as_the_lab_file(size: str) -> None:
    """The review's case: the drivers' own parser took '-16x16' (as 16x16) and any number
    of digits; the lab file and the drivers now share one parser."""
    with pytest.raises(ValueError, match="switch size"):
        parse_size(size)
    with pytest.raises(ValueError, match="switch size"):
        PolatisScpi("tcp://127.0.0.1:1", size=size)


@settings(max_examples=300, deadline=None)
@given(text=st.text(max_size=30) | st.from_regex(r"\s*[0-9]{1,12}\s*([xX]\s*[0-9]{1,12})?\s*",
                                                 fullmatch=True))
def test_any_size_text_is_a_size_in_bounds_or_a_value_error(text: str) -> None:
    try:
        n, m = parse_size(text)
    except ValueError as exc:
        assert str(exc).startswith("switch size ")
    else:
        assert 1 <= n <= MAX_PORTS_PER_SIDE and 0 <= m <= MAX_PORTS_PER_SIDE


def test_a_calient_size_is_bounded() -> None:
    (problem,) = refused(HEAD + switch(driver="calient-tl1", size="99999999999", user="u",
                                      password="p"))
    assert "field 'size'" in problem and "1..4096" in problem


@pytest.mark.parametrize(("fibres", "said"), [
    (fiber("a", "ocs1:0"), "[[fiber]] #3, field 'to': 'ocs1:0': ports and channels are "
                           "numbered from 1"),
    (fiber("ocs1:0", "b"), "[[fiber]] #3, field 'from': 'ocs1:0'"),
    (fiber("a", "ocs1:" + "9" * 5000), "[[fiber]] #3, field 'to'"),
    (fiber("ocs1:3", "ocs1:3"), "[[fiber]] #3: from 'ocs1:3' to itself"),
    (fiber("ocs1:2", "ocs1:10") + fiber("ocs1:10", "ocs1:2"),
     "[[fiber]] #3, #4 make a circle (ocs1:2 -> ocs1:10 -> ocs1:2)"),
    (fiber("ocs1:2", "ocs2:1") + fiber("ocs2:9", "ocs2:10") + fiber("ocs2:10", "ocs1:2")
     + fiber("ocs1:2", "ocs2:9"), "make a circle"),
    (fiber("b", "ocs1:1"), "[[fiber]] #3: 'ocs1:1' already receives [[fiber]] #1"),
    (fiber("ocs1:9", "a"), "[[fiber]] #3: 'ocs1:9' already sends into [[fiber]] #2"),
])
def test_fibres_light_could_not_take_are_refused(fibres: str, said: str) -> None:
    found = refused(GOOD + fibres)
    assert any(said in p for p in found), found


def test_a_long_chain_of_fibres_is_checked_in_one_pass() -> None:
    """The review's case: the circle check looked each node up in a list (quadratic on a
    long chain of fibres). 8,000 fibres, port to port, closing a circle at the far end."""
    chain = "".join(fiber(f"ocs1:{i}", f"ocs1:{i + 1}") for i in range(1, 8000))
    found = refused(HEAD + switch(size="4096x4096") + chain + fiber("ocs1:8000", "ocs1:7990"))
    (problem,) = found
    assert "make a circle (ocs1:7990 -> ocs1:7991" in problem and "-> ocs1:7990)" in problem


def test_a_circle_through_endpoints_is_a_duplex_cable_not_a_mistake() -> None:
    parse_text(GOOD + fiber("a", "b") + fiber("b", "a"), "lab.toml")


@pytest.mark.parametrize(("emulator", "said"), [
    ({"options": {"busy_port": "maybe"}}, "option 'busy_port': Input should be 'deny' or "
                                          "'replace' (got 'maybe')"),
    ({"options": {"port_quotes": "yes"}}, "option 'port_quotes'"),
    ({"options": {"input_dbm": "loud"}}, "option 'input_dbm'"),
    ({"options": {"loss_db": float("inf")}}, "option 'loss_db'"),
    ({"options": {"boot_mode": "WARM"}}, "option 'boot_mode'"),
    ({"options": {"error_format": "{code"}}, "option 'error_format'"),
    ({"options": {"colour": "red"}}, "unknown option(s) ['colour']"),
    ({"options": {"sid": "x" * 21}}, "option 'sid'"),
    ({"options": {"sid": "OCS 1"}}, "up to 20 letters, digits"),
    ({"options": {"sid": "ocs\n;"}}, "option 'sid'"),
    ({"options": {"sid": "é"}}, "option 'sid'"),
    ({"switch_time_ms": float("nan")}, "field 'emulator.switch_time_ms'"),
    ({"seed": -1}, "field 'emulator.seed'"),
])
def test_emulator_options_are_checked_by_value(emulator: dict[str, Any], said: str) -> None:
    text = HEAD + switch(size="8x8").replace("[instrument.emulator]\n", "")
    table = "[instrument.emulator]\n" + "\n".join(
        f"{key} = {_toml(value)}" for key, value in emulator.items()) + "\n"
    (problem,) = refused(text + table)
    assert "[[instrument]] #1 (id 'ocs1'), field 'emulator" in problem
    assert said in problem, problem


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, float) and value != value:
        return "nan"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace(
            "\n", "\\n") + '"'
    return repr(value).lower() if isinstance(value, bool) else repr(value)


@pytest.mark.parametrize("sid", ["", "OCS-1", "a.b_c", "x" * 20])
def test_a_polatis_sid_its_emulator_takes_is_taken(sid: str) -> None:
    text = HEAD + switch(size="8x8").replace("[instrument.emulator]\n", "")
    parse_text(text + f"[instrument.emulator]\noptions = {{ sid = {_toml(sid)} }}\n",
               "lab.toml")


def test_meter_and_mesh_options_are_checked_too() -> None:
    meter = ('[[instrument]]\nid = "pm1"\ndriver = "keysight-n77xx"\nemulate = true\n'
             '[instrument.emulator]\noptions = { model = "N9999Z", noise_db = -1 }\n')
    found = refused(HEAD + meter)
    assert any("option 'model'" in p for p in found)
    assert any("option 'noise_db'" in p for p in found)


def test_the_options_the_lab_file_knows_are_the_emulators() -> None:
    for driver, (kind, _) in EMULATION.items():
        emulator = {f.name for f in dataclasses.fields(KINDS[kind][1])}
        assert set(OPTIONS[driver].model_fields) == emulator, driver


def test_a_500_deep_inline_table_is_a_lab_file_error() -> None:
    (problem,) = refused(HEAD + "x = " + "{ a = " * 500 + "1" + " }" * 500 + "\n")
    assert "nest too deeply" in problem


def test_deep_arrays_are_a_lab_file_error() -> None:
    (problem,) = refused(HEAD + "x = " + "[" * 5000 + "]" * 5000 + "\n")
    assert "nest too deeply" in problem
    (problem,) = refused(HEAD + "x = " + "[" * 40 + "]" * 40 + "\n")
    assert "at most 16 levels" in problem


def test_a_5000_digit_number_is_a_lab_file_error() -> None:
    (problem,) = refused(HEAD + "description = 1" + "0" * 5000 + "\n")
    assert "a value cannot be read" in problem and "digits" in problem
    (problem,) = refused(HEAD.replace("[lab]\n", "[lab]\nlight_window_ms = 1" + "0" * 4000
                                      + "\n"))
    assert "field 'light_window_ms'" in problem and "characters)" in problem


@pytest.mark.parametrize(("text", "where", "said"), [
    (switch(emulate="yes"), "[[instrument]] #1 (id 'ocs1'), field 'emulate'",
     "valid boolean (got 'yes')"),
    (switch(emulate=1), "field 'emulate'", "valid boolean (got 1)"),
    (switch() + endpoint("a") + fiber("a", "ocs1:1", loss_db="0.5"),
     "[[fiber]] #1, field 'loss_db'",
     "valid number (got '0.5')"),
    (endpoint("a", launch_dbm="0"), "[[endpoint]] #1, field 'launch_dbm'",
     "valid number (got '0')"),
    (endpoint("a", launch_dbm=True), "field 'launch_dbm'", "valid number (got True)"),
    (switch(timeout="2"), "field 'timeout'", "valid number (got '2')"),
    (instrument("ocs1", "polatis-scpi", size="8x8", emulator={"seed": "3"}),
     "field 'emulator.seed'", "valid integer (got '3')"),
    (endpoint("h1.nic0") + host("h1", gpus="8"), "[[host]] #1, field 'gpus'",
     "valid integer (got '8')"),
    (endpoint("h1.nic0") + host("h1", gpus=8.0), "field 'gpus'", "valid integer (got 8.0)"),
    ('[lab]\nname = "x"\nlight_window_ms = "100"\n', "[lab], field 'light_window_ms'",
     "valid number (got '100')"),
])
def test_a_value_of_another_type_is_refused_not_converted(text: str, where: str,
                                                         said: str) -> None:
    """The lab file's types are TOML's: "yes" was taken as true, "0.5" as a loss."""
    (problem,) = refused(text if text.startswith("[lab]") else HEAD + text)
    assert where in problem and said in problem, problem


def test_a_whole_number_is_taken_where_a_fraction_may_be_given() -> None:
    lab = parse_text(GOOD + endpoint("c", launch_dbm=-3) + fiber("c", "ocs1:2", loss_db=1)
                     + '[[instrument]]\nid = "pm1"\ndriver = "thorlabs-pm100"\nemulate = true\n'
                     'timeout = 2\n', "lab.toml")
    assert lab.endpoint[-1].launch_dbm == -3.0 and lab.fiber[-1].loss_db == 1.0
    assert lab.get("pm1").timeout == 2.0


def test_files_that_are_too_big_or_not_text_are_lab_file_errors(tmp_path: Path) -> None:
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(LabFileError, match="larger than 4 MiB"):
        load_lab(big)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe" + HEAD.encode("utf-16-le"))
    with pytest.raises(LabFileError, match="not UTF-8 text"):
        load_lab(binary)
    with pytest.raises(LabFileError, match="cannot read"):
        load_lab(tmp_path)


def test_entries_of_the_wrong_shape_are_named() -> None:
    for text in (HEAD + "instrument = 5\n", HEAD + 'instrument = ["x"]\n',
                 HEAD + "fiber = [1, 2]\n", "lab = 3\n", HEAD + "[[instrument]]\nid = 5\n"):
        refused(text)


async def test_labd_check_prints_the_error_and_fails(tmp_path: Path) -> None:
    cases = {"size": HEAD + switch(size="-16x16"),
             "deep": HEAD + "x = " + "{ a = " * 500 + "1" + " }" * 500 + "\n",
             "digits": HEAD + "x = 1" + "0" * 5000 + "\n"}
    for name, text in cases.items():
        path = tmp_path / f"{name}.toml"
        path.write_text(text)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "labd", "check", str(path),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        try:
            async with asyncio.timeout(60):
                out, err = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        said = " ".join((out + err).decode().split())
        assert proc.returncode == 2, said
        assert "the lab file has problems" in said and "Traceback" not in said, said


# -- no input gets anything but a lab-file error out of the loader ---------------------------
def only_lab_file_errors(load: Any) -> None:
    try:
        result = load()
    except LabFileError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)
    else:
        assert isinstance(result, Lab)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_any_text_is_a_lab_or_a_lab_file_error(text: str) -> None:
    only_lab_file_errors(lambda: parse_text(text, "lab.toml"))


TOKENS = st.sampled_from([
    "[lab]\n", "[[instrument]]\n", "[[fiber]]\n", "[instrument.emulator]\n", "\n", " = ",
    "name", "id", "driver", "size", "from", "to", "options", '"polatis-scpi"', '"ocs1:0"',
    '"-16x16"', "inf", "nan", "-0", "1" * 60, "{", "}", "[", "]", ",", '"', "'", "=",
    "emulate = true\n", "true", "1e999", "0x10", "2024-01-01", '"ocs1"'])


@settings(max_examples=300, deadline=None)
@given(st.lists(TOKENS, max_size=40))
def test_toml_ish_token_soup_is_a_lab_or_a_lab_file_error(tokens: list[str]) -> None:
    only_lab_file_errors(lambda: parse_text(HEAD + "".join(tokens), "lab.toml"))


DEMO = packaged_labs()["demo"].read_text()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_mutated_demo_file_is_a_lab_or_a_lab_file_error(data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(DEMO)))
    end = data.draw(st.integers(start, min(len(DEMO), start + 200)))
    insert = data.draw(st.one_of(st.text(max_size=40), TOKENS))
    only_lab_file_errors(lambda: parse_text(DEMO[:start] + insert + DEMO[end:], "lab.toml"))


VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**40), 10**40) | st.floats()
    | st.text(max_size=30) | st.sampled_from(["ocs1:0", "16x16", "-16x16", "h0.nic0", "pm1:9"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                 max_size=4),
    max_leaves=12)


def _paths(value: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [here]
    if isinstance(value, dict):
        for key, child in value.items():
            found += _paths(child, (*here, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += _paths(child, (*here, index))
    return found


DEMO_DATA = tomllib.loads(DEMO)
DEMO_PATHS = [p for p in _paths(DEMO_DATA) if p]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(DEMO_PATHS), VALUES), min_size=1, max_size=3))
def test_a_demo_with_any_value_anywhere_is_a_lab_or_a_lab_file_error(
        changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    data = copy.deepcopy(DEMO_DATA)
    for path, value in changes:
        holder = data
        try:
            for key in path[:-1]:
                holder = holder[key]
            holder[path[-1]] = value
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed the place
    only_lab_file_errors(lambda: parse_lab(data, "lab.toml"))


@pytest.mark.parametrize("name", ["a" * 5000, "x/" * 3000, "a\x00b"])
def test_a_name_no_file_can_have_is_a_lab_file_error(name: str) -> None:
    with pytest.raises(LabFileError, match=r"cannot be a lab file's name|no such file") as info:
        load_lab(name)
    assert all(len(p) < 400 for p in info.value.problems)
