"""Meters through the daemon: readings on demand (one channel, all, a logged series, readings
one after another), what each channel sees, and bad requests refused with a message."""

import pytest

from labd.client.api import DaemonClient
from labd.errors import DaemonError
from tests.labs import meter, metered, switch
from tests.rigs import StartRig

LAB = (switch(switch_ms=1, size="8x8"), meter(emulator={"options": {"noise_db": 0.0}}),
       meter("pm2", driver="thorlabs-pm100"), metered("a", "b", 1, 9, 1))
#: Light through one circuit reaches the tap far above this; a dark channel is far below.
LIT_ABOVE_DBM, DARK_BELOW_DBM = -40.0, -60.0


async def test_meters_are_listed_with_what_each_channel_sees(start_rig: StartRig) -> None:
    async with start_rig("meters", *LAB, token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        try:
            listed = {m["id"]: m for m in await client.meters()}
            assert listed["pm1"]["logging"] is True and listed["pm2"]["logging"] is False
            assert listed["pm1"]["sees"] == [{"channel": 1, "from": "ocs1:9"}]
            assert listed["pm1"]["channels"] == 4
            assert await client.get("/v1/meters/pm2") == listed["pm2"]
        finally:
            await client.close()


async def test_readings_on_demand_one_all_and_a_series(start_rig: StartRig) -> None:
    async with start_rig("meters", *LAB, token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        try:
            await client.post("/v1/switches/ocs1/connections", {"pairs": [[1, 9]]})
            one = await client.read_power("pm1", [1])
            assert list(one["channels"]) == ["1"] and one["channels"]["1"][0] > LIT_ABOVE_DBM
            every = await client.read_power("pm1")
            assert list(every["channels"]) == ["1", "2", "3", "4"]
            assert every["channels"]["2"][0] < DARK_BELOW_DBM
            series = await client.read_power("pm1", [1, 2], points=50, interval_s=1e-3)
            assert series["interval_s"] == 1e-3 and series["t_ns"] is None
            assert [len(v) for v in series["channels"].values()] == [50, 50]
            assert all(v > LIT_ABOVE_DBM for v in series["channels"]["1"])
            back_to_back = await client.read_power("pm2", points=3)
            assert len(back_to_back["channels"]["1"]) == 3
            assert back_to_back["t_ns"] == sorted(back_to_back["t_ns"])
        finally:
            await client.close()


BAD = [
    ("pm2", {"points": 10, "interval_s": 0.001}, 422, "no logging function"),
    ("pm1", {"points": 100_000, "interval_s": 0.001}, 422, "at most 5 s"),
    ("pm1", {"channels": [9]}, 404, "channels 1..4"),
    ("pmX", {}, 404, "no meter 'pmX'"),
    ("pm1", {"points": "3"}, 422, "points"),
    ("pm1", {"points": 0}, 422, "points"),
    ("pm1", {"channels": []}, 422, "channels"),
    ("pm1", {"interval_s": 0}, 422, "interval_s"),
    ("pm1", {"rate": 3}, 422, "rate"),
]


async def test_bad_reads_are_refused_with_a_message(start_rig: StartRig) -> None:
    async with start_rig("meters", *LAB, token="t") as rig:
        client = DaemonClient(rig.daemon.url, "t")
        try:
            for meter_id, body, status, says in BAD:
                with pytest.raises(DaemonError) as refused:
                    await client.post(f"/v1/meters/{meter_id}/read", body)
                message = str(refused.value)
                assert f": {status} " in message and says in message, (body, message)
        finally:
            await client.close()
