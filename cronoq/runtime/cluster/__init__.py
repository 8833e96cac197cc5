"""Many processes, one scheduler: the runtime side of a shared store.

Every ``Scheduler`` given a store that supports it (``SqliteStore``,
``PostgresStore``) is a *member* of the store's cluster. One member leads:
it runs the engine. The others *follow*: their calls reach the leader through
the store's inbox and get its answer, and the leader leases attempts to their
executors. The design, the tables and the failure cases are in
docs/architecture.md ("Many processes, one scheduler"); the SQL is in
``cronoq.store.cluster``; the calls themselves are the versioned table of
``cronoq.runtime.operations``.

``Cluster`` (``cycle``) is one process's part: a loop on the scheduler's
event loop that runs one *cycle* of store I/O at a time on a thread of its
own (the writes queued since the last cycle, then the reads needed now), for
three roles, one module each:

- ``follower``: sends calls and waits for their answers, at most
  ``request_timeout`` (then the call is taken back and raises
  ``LeaderUnavailable``, or, if the leader answered meanwhile, gets that
  answer); resolves the handles of watched tasks when the store says they
  ended;
- ``member``: claims the attempts leased to it, runs them on its own
  runners and writes their outcomes;
- ``leader`` (with ``ClusterRunner``): carries out the inbox's requests in
  order, places every attempt on the least busy member (itself included:
  its own attempts go straight to its runners), reads the outcomes, and
  gives back or fails the attempts of members that stopped heartbeating.

``wire`` holds what they pass one another as data (errors, packed payloads,
the records of leased attempts).
"""

from .cycle import Cluster
from .leader import ClusterRunner
from .member import MemberCheckpoints
from .wire import RemoteEntry, decode_error, encode_error

__all__ = ["Cluster", "ClusterRunner", "MemberCheckpoints", "encode_error", "decode_error", "RemoteEntry"]
