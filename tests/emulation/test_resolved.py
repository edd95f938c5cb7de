"""``labd emulate --resolved``: the copy of the lab file is written as a person writes
one, every array of tables as ``[[name]]`` tables, so any entry can be pasted into a lab
file; it reads back as the same data."""

from __future__ import annotations

import tomllib

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from labd.emulation.emulators import lab_toml
from labd.lab.loader import load_lab


def test_the_demo_lab_is_written_as_tables_and_reads_back_the_same() -> None:
    lab = load_lab("demo")
    with open(lab.source, "rb") as handle:
        data = tomllib.load(handle)
    text = lab_toml(data)
    assert tomllib.loads(text) == data
    assert text.startswith("[lab]\n")
    assert "= [\n    {" not in text and "= [{" not in text  # no inline array of tables
    assert text.count("[[endpoint]]\n") == len(data["endpoint"])
    assert text.count("[[fiber]]\n") == len(data["fiber"])
    assert text.count("[[instrument]]\n") == len(data["instrument"])
    # One endpoint's table, pasted after another lab's [lab] table, is an endpoint there.
    start = text.index("[[endpoint]]")
    one = text[start:text.index("\n\n", start)]
    pasted = tomllib.loads('[lab]\nname = "x"\n' + one + "\n")
    assert pasted["endpoint"] == [data["endpoint"][0]] and pasted["lab"] == {"name": "x"}


KEYS = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
               max_size=8)
SCALARS = st.one_of(st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=10),
                    st.floats(allow_nan=False, allow_infinity=False))
TABLES = st.recursive(
    st.dictionaries(KEYS, SCALARS, max_size=4),
    lambda inner: st.dictionaries(KEYS, st.one_of(SCALARS, inner,
                                                  st.lists(inner, min_size=1, max_size=3)),
                                  max_size=4),
    max_leaves=8)


# Nested tables are slow to draw on a loaded machine; the property is cheap to check.
@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(KEYS, st.one_of(TABLES, st.lists(TABLES, min_size=1, max_size=3)),
                       max_size=4))
def test_any_lab_data_reads_back_the_same(data: dict[str, object]) -> None:
    assert tomllib.loads(lab_toml(data)) == data
