"""How much compute between communication phases hides reconfiguration? Replays a synthetic
3D-parallel schedule (labd.measure.schedule) with growing compute windows, speculatively, and
prints the share of windows hidden and the time added per iteration.

    python scripts/window_sweep.py [--url http://127.0.0.1:8470] [--switch ocs1] [--ports 16]
"""

import argparse
import asyncio

from labd.client.api import DaemonClient
from labd.measure.schedule import replay, schedule_summary, synthetic
from labd.token import find_token


async def main(url: str, switch: str, ports: int, token: str | None = None,
               windows: tuple[float, ...] = (2, 5, 10, 20, 40)) -> list[dict]:
    client = DaemonClient(url, token or find_token(None))
    results = []
    try:
        for compute_ms in windows:
            plan = synthetic(pp=2, dp=2, tp=2, microbatches=2, layers=1, ingress=ports,
                             switch=switch, compute_ms=compute_ms)
            rows = [r async for r in replay(client, plan, iterations=1, speculative=True)]
            (result,) = schedule_summary(rows)
            print(f"{compute_ms:5g} ms windows: {result['hidden'] * 100:3.0f} % hidden, "
                  f"{result['added_per_iteration']:7.2f} ms added per iteration")
            results.append(result)
    finally:
        await client.close()
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8470")
    parser.add_argument("--switch", default="ocs1")
    parser.add_argument("--ports", type=int, default=16)
    args = parser.parse_args()
    asyncio.run(main(args.url, args.switch, args.ports))
