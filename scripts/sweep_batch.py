"""A custom sweep through labd's Python API: device time against batch size on one switch.

    python scripts/sweep_batch.py [--url http://127.0.0.1:8470] [--switch ocs1] [--rounds 20]
"""

import argparse
import asyncio

from labd.client.api import DaemonClient
from labd.measure.campaign import ReconfigPlan, run_reconfig, summary
from labd.token import find_token


async def main(url: str, switch: str, rounds: int, token: str | None = None) -> list[dict]:
    client = DaemonClient(url, token or find_token(None))
    results = []
    try:
        for k in (1, 2, 4, 8):
            plan = ReconfigPlan(switch, "random", rounds=rounds, k=k, verify_light=False)
            rows = [row async for row in run_reconfig(client, plan)]
            device = next(s for s in summary(rows) if s["span"] == "device")
            print(f"{switch} k={k:2}: device p50 {device['p50']:7.3f} ms, "
                  f"p99 {device['p99']:7.3f} ms ({device['n']} reconfigurations)")
            results.append(device)
    finally:
        await client.close()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8470")
    parser.add_argument("--switch", default="ocs1")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.switch, args.rounds))
