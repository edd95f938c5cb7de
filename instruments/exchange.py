"""What one driver operation put on the wire, and when, as a value the call returns."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Exchange:
    """The wire times of one operation (CLOCK_MONOTONIC ns; None where nothing was sent or
    nothing came back): its time on the wire, free of the scheduling around it.

    A change returns its own, so that calls that overlap cannot read each other's: the
    times are taken while the operation still holds its link."""

    sent_ns: int | None = None
    """When the operation's first write left."""
    answered_ns: int | None = None
    """When the bytes of its last reply arrived, as the transport saw them."""
    activated_ns: int | None = None
    """When the first command that moved the light left: :attr:`sent_ns`, unless the
    driver marked the commands that do (a switch whose change takes commands that only
    prepare or tidy up around those, e.g. a CALIENT's ENT-CRS before ACT-CRS)."""
    acknowledged_ns: int | None = None
    """When the reply to the last command that moved the light arrived:
    :attr:`answered_ns`, unless the driver marked the commands that do."""

    def then(self, later: Exchange) -> Exchange:
        """This operation followed by ``later``, as one: the first's start, the last's end."""
        return Exchange(self.sent_ns, later.answered_ns, self.activated_ns,
                        later.acknowledged_ns)


#: An operation that sent nothing (an empty request).
NOTHING = Exchange()
