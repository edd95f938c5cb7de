import pytest

from instruments.address import parse_address
from instruments.errors import AddressError


def test_tcp_serial_visa() -> None:
    tcp = parse_address("tcp://10.0.0.20:5025")
    assert (tcp.scheme, tcp.target, tcp.port) == ("tcp", "10.0.0.20", 5025)
    ser = parse_address("serial:///dev/ttyUSB0?baud=115200&parity=E")
    assert ser.target == "/dev/ttyUSB0"
    assert ser.options == {"baud": "115200", "parity": "E"}
    visa = parse_address("visa://TCPIP::10.0.0.5::5025::SOCKET")
    assert visa.target == "TCPIP::10.0.0.5::5025::SOCKET"
    assert str(tcp) == "tcp://10.0.0.20:5025"
    memory = parse_address("memory://ocs1")
    assert (memory.scheme, memory.target, str(memory)) == ("memory", "ocs1", "memory://ocs1")


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("10.0.0.1:5025", "no scheme"),
        ("tcp://host", "expected tcp://HOST:PORT"),
        ("tcp://host:99999", "port must be a number"),
        ("serial://ttyUSB0", "absolute device path"),
        ("serial:///dev/ttyUSB0?speed=9600", "unknown serial option"),
        ("serial:///dev/ttyUSB0?baud=fast", "baud must be a whole number"),
        ("gpib://5", "unknown scheme"),
        ("memory://", "missing device name"),
    ],
)
def test_bad_addresses_say_what_is_wrong(text: str, words: str) -> None:
    with pytest.raises(AddressError, match=words):
        parse_address(text)
