"""MQTT, as every client of labd speaks it, the daemon's bridge and the GPU-host agents
alike (and nothing of the daemon is loaded here):

- ``client``       the broker's address, sockets that send small messages at once, a
                   publish that a cancellation can stop, the backoff between tries
- ``topics``       where a lab's messages go: ``labd/<lab>[@<instance>]/...``
- ``payload``      size and nesting limits, checked before a payload is parsed
- ``envelope``     signed messages: who sent it, in which session, in what order, and a MAC
                   over all of it, so that a spoofed or replayed message changes nothing
- ``credentials``  a lab's MQTT secrets: broker logins and signing keys, kept in one file
- ``mosquitto``    the password and ACL files that bind each identity to its own topics,
                   and the listener's config (``labd broker-config``)
- ``private``      a Mosquitto of a run's own on a free loopback port, stopped and started
                   again on it (the tests, the soak, the benchmarks)
"""

# Its modules, each imported where it is used: importing the package loads none of them.
__all__ = ["client", "credentials", "envelope", "mosquitto", "payload", "private", "topics"]
