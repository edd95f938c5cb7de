"""The emulated training job that emulated hosts run: ``python -m labd.agent.trainer``.

It behaves, as far as labd can see, like one rank of a real job: it reads its place from
the environment the agent gives every job (``LABD_RANK``, ``LABD_WORLD_SIZE``,
``LABD_EPOCH``, ``LABD_RANK_MAP``), spends ``--init-ms`` setting up its collectives, then
completes a step every ``--step-ms``, and says so on stdout with the progress lines every
labd job may print (see docs/agent.md)::

    LABD_PROGRESS ready
    LABD_PROGRESS step 1

It stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="labd-trainer", description=__doc__.split("\n")[0])
    parser.add_argument("--init-ms", type=float, default=200.0)
    parser.add_argument("--step-ms", type=float, default=100.0)
    parser.add_argument("--steps", type=int, default=0, help="stop after this many (0: run)")
    args = parser.parse_args(argv)
    try:
        rank = int(os.environ["LABD_RANK"])
        world = int(os.environ["LABD_WORLD_SIZE"])
        ranks = json.loads(os.environ.get("LABD_RANK_MAP", "[]"))
    except (KeyError, ValueError) as exc:
        print(f"labd-trainer: the agent's job environment is missing or bad: {exc}",
              file=sys.stderr)
        return 2
    if not 0 <= rank < world or len(ranks) != world:
        print(f"labd-trainer: rank {rank} of {world} does not fit the rank map "
              f"({len(ranks)} entries)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    time.sleep(args.init_ms / 1000)
    print("LABD_PROGRESS ready", flush=True)
    step = 0
    deadline = time.monotonic()
    while not args.steps or step < args.steps:
        deadline += args.step_ms / 1000
        time.sleep(max(0.0, deadline - time.monotonic()))
        step += 1
        print(f"LABD_PROGRESS step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
