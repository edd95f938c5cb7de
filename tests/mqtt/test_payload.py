"""The bus's limits, checked before a payload is parsed: any bytes at all give a value or a
PayloadError, never another exception, and nothing over the limits is parsed."""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from labd.errors import PayloadError
from labd.mqtt.payload import MAX_BYTES, MAX_DEPTH, check, loads

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                    | st.text(), lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=30)


def depth(value: object) -> int:
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2000))
def test_any_bytes_give_a_value_or_a_payload_error(raw: bytes) -> None:
    try:
        loads(raw)
    except PayloadError as exc:
        assert str(exc)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_json_within_the_limits_comes_back_as_it_went(value: object) -> None:
    raw = json.dumps(value).encode()
    if depth(value) <= MAX_DEPTH:
        assert loads(raw) == value


@settings(max_examples=100, deadline=None)
@given(st.integers(MAX_DEPTH + 1, 5000), st.sampled_from(["[", "{\"a\":"]),
       st.text(alphabet="]}\"\\", max_size=5))
def test_deep_nesting_is_refused_before_parsing_even_with_brackets_in_strings(
        levels: int, opener: str, noise: str) -> None:
    # Strings full of closing brackets must not hide the depth.
    raw = (opener + json.dumps(noise) + ",") * levels
    try:
        check(raw.encode())
    except PayloadError as exc:
        assert "nests" in str(exc)
    else:
        raise AssertionError(f"{levels} levels were let through")


def test_the_reproductions() -> None:
    for raw, words in ((b'["' * 100_000, "nests"), (b"[" * 100_000, "nests"),
                       (b"x" * (MAX_BYTES + 1), "at most"), (b"\xff\xfe{}", "not UTF-8"),
                       ('{"a": 1}'.encode("utf-16"), "not UTF-8")):
        try:
            loads(raw)
        except PayloadError as exc:
            assert words in str(exc), (raw[:20], exc)
        else:
            raise AssertionError(f"{raw[:20]!r} was taken")
    assert loads(json.dumps("[" * 100).encode()) == "[" * 100  # in a string: no nesting


def test_unclosed_strings_are_read_in_one_pass() -> None:
    """Backslash-quote pairs behind a few brackets made the string scan start again at every
    quote: 18 s for 64 KiB, minutes at the size limit, with the bridge's loop frozen for
    anyone on the broker. Checked in a child process, so that a relapse fails the test
    (at the deadline, which is not a speed target: one pass takes milliseconds) instead of
    hanging the suite."""
    worst = [b"[" * (MAX_DEPTH + 1) + b'"\\' * (MAX_BYTES // 2 - MAX_DEPTH),
             b"[" * (MAX_DEPTH + 1) + b'"\\"' * (MAX_BYTES // 3 - MAX_DEPTH) + b"\\"]
    program = ("import sys\nfrom labd.mqtt.payload import check\nfrom labd.errors import "
               "PayloadError\nfor n in sys.argv[1:]:\n    payload = open(n, 'rb').read()\n"
               "    try:\n        check(payload)\n    except PayloadError as exc:\n"
               "        print(exc)\n")
    with tempfile.TemporaryDirectory() as scratch:
        names = []
        for i, payload in enumerate(worst):
            assert len(payload) <= MAX_BYTES
            (Path(scratch) / str(i)).write_bytes(payload)
            names.append(str(Path(scratch) / str(i)))
        done = subprocess.run([sys.executable, "-c", program, *names], capture_output=True,
                              text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("nests") == len(worst), done.stdout
