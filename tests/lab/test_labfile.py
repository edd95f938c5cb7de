from pathlib import Path

import pytest

from labd.errors import LabFileError
from labd.lab.loader import load_lab, packaged_labs


def test_packaged_demo_lab_has_every_switch_family() -> None:
    assert "demo" in packaged_labs()
    lab = load_lab("demo")
    assert lab.lab.name == "demo"
    assert {e.driver for e in lab.instrument} == {
        "polatis-scpi", "polatis-tl1", "calient-tl1", "qontrol-mesh", "keysight-n77xx",
        "thorlabs-pm100"}
    assert lab.fiber and lab.endpoint
    assert all(e.emulate for e in lab.instrument)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "lab.toml"
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(LabFileError) as info:
        load_lab(path)
    return info.value.problems


def test_mistakes_name_file_entry_field_and_expectation(tmp_path: Path) -> None:
    path = write(tmp_path, """
[lab]
name = "rack-a"

[[instrument]]
id = "ocs1"
driver = "polatis-scpi"
address = "tcp://10.0.0.20"
size = "16by16"
colour = "red"

[[instrument]]
id = "ocs2"
driver = "polatis-tl1"
address = "tcp://10.0.0.21:3082"

[[instrument]]
id = "ocs3"
driver = "calient-tl1"
address = "tcp://10.0.0.22:3082"
user = "admin"
password = "x"
size = "16x16"

[[instrument]]
id = "ocs4"
driver = "lumentum"
""")
    found = problems(path)
    head = f"{path}: [[instrument]] #"
    assert f"{head}1 (id 'ocs1'), field 'address': address 'tcp://10.0.0.20': " \
           "expected tcp://HOST:PORT (got 'tcp://10.0.0.20')" in found
    assert any(p.startswith(f"{head}1 (id 'ocs1'), field 'size'") and "NxM" in p
               for p in found)
    assert any(p.startswith(f"{head}1 (id 'ocs1'), field 'colour': is not a known field")
               for p in found)
    assert f"{head}2 (id 'ocs2'), field 'user': is required" in found
    assert any(p.startswith(f"{head}3 (id 'ocs3'), field 'size'") and "N ports" in p
               for p in found)
    assert any(p.startswith(f"{head}4 (id 'ocs4'): unknown driver 'lumentum'") for p in found)


def test_emulated_entries_must_listen_here(tmp_path: Path) -> None:
    path = write(tmp_path, """
[lab]
name = "x"
[[instrument]]
id = "ocs1"
driver = "polatis-scpi"
address = "tcp://10.0.0.20:5025"
emulate = true
""")
    (problem,) = problems(path)
    assert "listens on this machine" in problem


def test_duplicate_ids_and_missing_address(tmp_path: Path) -> None:
    path = write(tmp_path, """
[lab]
name = "x"
[[instrument]]
id = "a"
driver = "polatis-scpi"
emulate = true
[[instrument]]
id = "a"
driver = "polatis-scpi"
""")
    (problem,) = problems(path)
    assert "[[instrument]] #2 (id 'a')" in problem
    assert "'address' is required unless emulate = true" in problem
    (problem,) = problems(write(tmp_path, path.read_text() + 'emulate = true\n'))
    assert "instrument and endpoint ids must be unique; repeated: a" in problem


def test_toml_syntax_and_missing_files(tmp_path: Path) -> None:
    (problem,) = problems(write(tmp_path, "[lab\nname = 1"))
    assert problem.startswith(f"{tmp_path / 'lab.toml'}: not valid TOML")
    with pytest.raises(LabFileError, match="no such file, and no packaged lab"):
        load_lab("no-such-lab")


def test_fibres_must_join_things_that_exist(tmp_path: Path) -> None:
    path = write(tmp_path, """
[lab]
name = "x"
[[instrument]]
id = "ocs1"
driver = "polatis-scpi"
emulate = true
size = "4x4"
[[instrument]]
id = "pm1"
driver = "keysight-n77xx"
emulate = true
[[endpoint]]
id = "gpu0"
launch_dbm = 0
[[fiber]]
from = "gpu0"
to = "ocs1:1"
[[fiber]]
from = "ocs1:9"
to = "gpu1"
[[fiber]]
from = "pm1:1"
to = "ocs1:2"
[[fiber]]
from = "ocs1:5"
to = "gpu0"
tap = "pm1:5"
""")
    (problem,) = problems(path)
    assert "[[fiber]] #2, field 'from': 'ocs1:9': ocs1 has ports 1..8" in problem
    assert "[[fiber]] #2, field 'to': 'gpu1' names no [[endpoint]]" in problem
    assert "[[fiber]] #3, field 'from': 'pm1:1' is a meter channel" in problem
    assert "[[fiber]] #4, field 'tap': 'pm1:5': pm1 has channels 1..4" in problem


def test_mesh_sizes(tmp_path: Path) -> None:
    path = write(tmp_path, """
[lab]
name = "x"
[[instrument]]
id = "m"
driver = "qontrol-mesh"
emulate = true
size = "6x6"
""")
    (problem,) = problems(path)
    assert "field 'size'" in problem and "power of two" in problem


SLOW = """
[lab]
name = "x"
{lab}
[[instrument]]
id = "cal"
driver = "calient-tl1"
emulate = true
user = "admin"
password = "x"
{own}
[instrument.emulator]
switch_time_ms = 180
jitter_ms = 20
"""


def test_the_light_window_must_cover_an_emulated_switch(tmp_path: Path) -> None:
    (problem,) = problems(write(tmp_path, SLOW.format(lab="", own="")))
    assert problem.endswith("[[instrument]] #1 (id 'cal'): its emulator switches in up to "
                            "200 ms, not within the light window of 100 ms; set "
                            "'light_window_ms' (on the switch or in [lab]) above it")
    lab = load_lab(write(tmp_path, SLOW.format(lab="light_window_ms = 250", own="")))
    assert lab.light_window_ms("cal") == 250
    lab = load_lab(write(tmp_path, SLOW.format(lab="", own="light_window_ms = 300")))
    assert lab.light_window_ms("cal") == 300 and lab.lab.light_window_ms == 100
    (problem,) = problems(write(tmp_path, SLOW.format(lab="light_window_ms = 0", own="")))
    assert "field 'light_window_ms'" in problem


def test_hosts_and_jobs_refer_to_endpoints(tmp_path: Path) -> None:
    path = write(tmp_path, """
[lab]
name = "x"
[[endpoint]]
id = "g0"
[[endpoint]]
id = "g1"
[[host]]
id = "h0"
nics = ["g0", "g9"]
[[job]]
id = "j"
topology = "pairs"
members = ["g0", "g1", "g7", "g8"]
""")
    (problem,) = problems(path)
    assert "[[host]] #1 (id 'h0'), field 'nics': 'g9' names no [[endpoint]]" in problem
    assert "[[job]] #1 (id 'j'), field 'members': 'g7' names no [[endpoint]]" in problem
    (problem,) = problems(write(tmp_path, path.read_text().replace(
        '"g0", "g1", "g7", "g8"', '"g0", "g1", "g0"').replace('"g0", "g9"', '"g0"')))
    assert "[[job]] #1, field 'members'" not in problem
    assert "'pairs' needs an even number of members" in problem or "appears twice" in problem


def test_spares_are_host_nics_and_not_members(tmp_path: Path) -> None:
    base = """
[lab]
name = "x"
[[endpoint]]
id = "g0"
[[endpoint]]
id = "g1"
[[endpoint]]
id = "g2"
[[host]]
id = "h0"
nics = ["g0", "g1"]
[[host]]
id = "h1"
nics = ["NICS"]
[[job]]
id = "j"
topology = "ring"
members = ["g0", "g1"]
spares = [SPARES]
recovery = "RECOVERY"
"""

    def lab(nics: str, spares: str, recovery: str = "automatic") -> Path:
        return write(tmp_path, base.replace("NICS", nics).replace("SPARES", spares)
                     .replace("RECOVERY", recovery))

    (problem,) = problems(lab("g2", '"g2", "g9"'))
    assert "[[job]] #1 (id 'j'), field 'spares': 'g9' is no NIC of a [[host]]" in problem
    (problem,) = problems(lab("g2", '"g1"'))
    assert "g1 is both a member and a spare" in problem
    (problem,) = problems(lab("g1", '"g2"'))
    assert "'g1' is already a NIC of host 'h0'" in problem
    (problem,) = problems(lab("g2", '"g2"', recovery="sometimes"))
    assert "recovery" in problem and "automatic" in problem
    loaded = load_lab(lab("g2", '"g2"', recovery="ask"))
    assert loaded.job[0].spares == ["g2"] and loaded.job[0].recovery == "ask"
    assert loaded.placement("g1") == (loaded.host[0], 1)  # the second NIC: GPU 1
    assert loaded.placement("g9") is None


def test_a_daemon_table_holds_settings_of_labd_run(tmp_path: Path) -> None:
    """Loaded, kept out of dumps (it may hold a URL with a password), and checked as
    settings: a misspelt name or a value no setting takes is found by loading the lab."""
    lab = load_lab(write(tmp_path, '[lab]\nname = "x"\n[daemon]\nport = 9300\n'
                                   'mqtt = "mqtt://labd:pw-in-url@broker:1883"\n'))
    assert lab.daemon == {"port": 9300, "mqtt": "mqtt://labd:pw-in-url@broker:1883"}
    assert "daemon" not in lab.model_dump() and "pw-in-url" not in lab.model_dump_json()
    assert load_lab(write(tmp_path, '[lab]\nname = "x"\n')).daemon == {}
    found = problems(write(tmp_path, '[lab]\nname = "x"\n[daemon]\nprot = 9300\n'
                                     'port = "high"\nlease_ttl_s = -1\n'))
    assert len(found) == 1
    assert found[0].startswith(f"{tmp_path / 'lab.toml'}: [daemon]: ")
    assert "field 'prot': no setting of that name (did you mean 'port'?)" in found[0]
    assert "field 'port': Input should be a valid integer" in found[0]
    assert "field 'lease_ttl_s': Input should be greater than 0 (got -1)" in found[0]
    assert problems(write(tmp_path, 'daemon = 3\n[lab]\nname = "x"\n')) == [
        f"{tmp_path / 'lab.toml'}: [daemon]: Input should be a valid dictionary (got 3)"]
    # What only the settings together decide waits for every source: --config may hold
    # the key that goes with this certificate.
    assert load_lab(write(tmp_path, '[lab]\nname = "x"\n[daemon]\ntls_cert = "c.pem"\n'
                          )).daemon == {"tls_cert": "c.pem"}
