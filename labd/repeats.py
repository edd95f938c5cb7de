"""One limiter for what repeats: log lines and warning events about the same trouble (a
sender's refused messages, the store refusing writes, the broker out of reach) are told at
most once per key every ``every_s`` and at most ``overall`` times in all per ``every_s``; what
was held back is counted and told with the next line that goes out.

A flood of bad messages, a full disk or a broker that is down must not become a flood of
lines (or of events, which go back out on the bus): the first says what is wrong, the next
says how many more there were. Memory is bounded whatever keys the senders make up: the
keys heard longest ago are forgotten first, and the overall budget holds however many
there are. The standard library only: the GPU-host agent uses it too.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["EVERY_S", "Repeats", "Told"]

#: One line per key at most this often, by default.
EVERY_S = 10.0


@dataclass(frozen=True)
class Told:
    """A line that may go out now, and what was held back before it."""

    held: int
    """Lines of the same key held back since the last one told."""
    held_overall: int
    """Lines of any key held back by the overall budget since the last one told."""

    def suffix(self) -> str:
        """`` (N more since the last one)``, or nothing: to end the line with."""
        parts = []
        if self.held:
            parts.append(f"{self.held} more like it since the last one")
        if self.held_overall:
            parts.append(f"{self.held_overall} other lines held back")
        return f" ({'; '.join(parts)})" if parts else ""


class Repeats:
    """Whether a repeated line may be told now (:meth:`tell`): per key and overall."""

    def __init__(self, every_s: float = EVERY_S, *, overall: int = 20, keys: int = 4096,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self.overall = overall
        self.max_keys = keys
        self._clock = clock
        # key -> (when last told, held back since)
        self._keys: OrderedDict[str, tuple[float, int]] = OrderedDict()
        self._window_start = -float("inf")
        self._told_in_window = 0
        self._held_overall = 0
        self.told = 0
        """Lines told so far."""
        self.held = 0
        """Lines held back so far."""

    def tell(self, key: str) -> Told | None:
        """A :class:`Told` if a line about ``key`` may go out now; None (and counted) if it is
        held back."""
        now = self._clock()
        last, held = self._keys.get(key, (-float("inf"), 0))
        if now - last < self.every_s:
            self._keys[key] = (last, held + 1)
            self.held += 1
            return None
        if now - self._window_start >= self.every_s:
            self._window_start, self._told_in_window = now, 0
        if self._told_in_window >= self.overall:
            self._held_overall += 1
            self.held += 1
            return None
        self._told_in_window += 1
        self._keys[key] = (now, 0)
        self._keys.move_to_end(key)
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)  # the key told longest ago
        told = Told(held, self._held_overall)
        self._held_overall = 0
        self.told += 1
        return told
