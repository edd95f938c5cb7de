"""Sealed messages: only the sender's key makes a seal the opener takes, once, on the topic
it was sealed for; anything else is refused, whatever the bytes."""

import json
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from labd.errors import BusError, RefusedMessage
from labd.mqtt.envelope import LAST, Opener, Sealer, new_key

H1, H2 = new_key(), new_key()
KEYS = {"h1": H1, "h2": H2}
TOPIC = "labd/lab/hosts/h1/events"


def opener(**options: float) -> Opener:
    return Opener(KEYS.get, **options)


def test_a_seal_is_taken_once_from_its_sender_on_its_topic() -> None:
    sealer, o = Sealer("h1", H1), opener()
    first = sealer.seal(TOPIC, '{"gpu": 0}')
    assert o.open(TOPIC, first, sender="h1") == ("h1", '{"gpu": 0}')
    with pytest.raises(RefusedMessage, match="replayed"):
        o.open(TOPIC, first, sender="h1")
    with pytest.raises(RefusedMessage, match="bad signature"):  # moved to another topic
        o.open("labd/lab/hosts/h1/heartbeat", sealer.seal(TOPIC, "{}"), sender="h1")
    with pytest.raises(RefusedMessage, match="not by 'h1'"):
        o.open(TOPIC, Sealer("h2", H2).seal(TOPIC, "{}"), sender="h1")
    with pytest.raises(RefusedMessage, match="bad signature"):  # h1's name, h2's key
        o.open(TOPIC, Sealer("h1", H2).seal(TOPIC, "{}"), sender="h1")
    with pytest.raises(RefusedMessage, match="no key"):
        o.open(TOPIC, Sealer("h3", H2).seal(TOPIC, "{}"))
    second = sealer.seal(TOPIC, "{}")
    assert o.open(TOPIC, second, sender="h1")[1] == "{}"


def test_an_older_session_is_refused_and_a_newer_one_taken() -> None:
    o = opener()
    old, new = Sealer("h1", H1), Sealer("h1", H1)
    stale = old.seal(TOPIC, "{}")
    o.open(TOPIC, new.seal(TOPIC, "{}"), sender="h1")
    with pytest.raises(RefusedMessage, match="earlier session"):
        o.open(TOPIC, stale, sender="h1")


def test_a_last_will_is_taken_from_its_own_session_only() -> None:
    o = opener()
    sealer = Sealer("h1", H1)
    will = sealer.seal("labd/lab/hosts/h1/status", b"offline", last=True)
    o.open("labd/lab/hosts/h1/status", sealer.seal("labd/lab/hosts/h1/status", b"online"),
           sender="h1")
    assert o.open("labd/lab/hosts/h1/status", will, sender="h1")[1] == "offline"
    assert json.loads(will)["seq"] == LAST
    with pytest.raises(RefusedMessage, match="replayed"):
        o.open("labd/lab/hosts/h1/status", will, sender="h1")


def test_a_message_stamped_far_from_now_is_stale_unless_retained() -> None:
    sealer = Sealer("h1", H1)
    sealer._last_ts = time.time_ns() + 3600 * 10**9  # its clock an hour ahead
    message = sealer.seal(TOPIC, "{}")
    with pytest.raises(RefusedMessage, match="stale"):
        opener(max_skew_s=60).open(TOPIC, message, sender="h1")
    assert opener().open(TOPIC, message, sender="h1", retained=True)[1] == "{}"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=3000))
def test_any_bytes_are_refused_with_a_bus_error(raw: bytes) -> None:
    with pytest.raises(BusError):
        opener().open(TOPIC, raw, sender="h1")


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["v", "from", "session", "seq", "ts_ns", "body", "mac",
                                        "x"]),
                       st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                       | st.floats(), max_size=8))
def test_any_forged_seal_is_refused(fields: dict[str, object]) -> None:
    with pytest.raises(BusError):
        opener().open(TOPIC, json.dumps(fields).encode(), sender="h1")


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=500), st.integers(0, 500), st.binary(min_size=1, max_size=1))
def test_one_changed_byte_is_refused_or_changes_nothing(body: str, where: int,
                                                        flip: bytes) -> None:
    sealed = bytearray(Sealer("h1", H1).seal(TOPIC, body))
    where %= len(sealed)
    sealed[where] = flip[0]
    try:
        _, opened = opener().open(TOPIC, bytes(sealed), sender="h1")
    except BusError:
        return
    # Taken only where the byte changed nothing the seal covers (an escape's case: \u00e9
    # and \u00E9 are one character).
    assert opened == body
