"""The emulated training job that emulated hosts run: ``python -m labd.agent.trainer``.

It behaves, as far as labd can see, like one rank of a real job: it reads its place from
the environment the agent gives every job (``LABD_RANK``, ``LABD_WORLD_SIZE``,
``LABD_EPOCH``, ``LABD_RANK_MAP``), spends ``--init-ms`` setting up its collectives, then
completes a step every ``--step-ms``, and says so on stdout with the progress lines every
labd job may print (see docs/agent.md)::

    LABD_PROGRESS ready
    LABD_PROGRESS step 1

It exits at once, with status 0, on SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main(argv: list[str] | None = None) -> int:
    try:
        init_ms, step_ms, steps = _options(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"labd-trainer: {exc}; usage: trainer.py [--init-ms=MS] [--step-ms=MS] "
              "[--steps=N]", file=sys.stderr)
        return 2
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
    # Gone at once, as a killed rank is: an interpreter's orderly shutdown is tens of ms
    # that a restart waits for (every line out was flushed as it was printed).
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    time.sleep(init_ms / 1000)
    print("LABD_PROGRESS ready", flush=True)
    step = 0
    deadline = time.monotonic()
    while not steps or step < steps:
        deadline += step_ms / 1000
        time.sleep(max(0.0, deadline - time.monotonic()))
        step += 1
        print(f"LABD_PROGRESS step {step}", flush=True)
    return 0


def _options(argv: list[str]) -> tuple[float, float, int]:
    """``--init-ms``, ``--step-ms`` and ``--steps`` (stop after this many; 0: run), as
    ``--name=value`` or ``--name value``. By hand, not argparse: its import is a fifth of
    this process's start-up, and a restarted job's first step waits for it."""
    values = {"--init-ms": "200", "--step-ms": "100", "--steps": "0"}
    words = list(argv)
    while words:
        word = words.pop(0)
        name, eq, value = word.partition("=")
        if name not in values:
            raise ValueError(f"unknown option {word!r}")
        if not eq:
            if not words:
                raise ValueError(f"{name} needs a value")
            value = words.pop(0)
        values[name] = value
    try:
        init_ms, step_ms = float(values["--init-ms"]), float(values["--step-ms"])
        steps = int(values["--steps"])
    except ValueError:
        raise ValueError(f"bad option value in {' '.join(argv)!r}") from None
    if init_ms < 0 or step_ms <= 0 or steps < 0:
        raise ValueError(f"option out of range in {' '.join(argv)!r}")
    return init_ms, step_ms, steps


if __name__ == "__main__":
    sys.exit(main())
