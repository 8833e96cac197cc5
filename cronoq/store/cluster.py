"""The store as the medium of one scheduler across processes.

Every process given the same store is a *member*: a row in
``cronoq_members`` it renews with a heartbeat. The process that leads runs
the engine; the others reach it through the store:

- a follower's calls (submissions, cancels, ...) are rows of
  ``cronoq_inbox``; the leader reads them in ``seq`` order, carries them out
  and writes each answer into its row; the follower reads it and deletes it;
- the leader leases attempts to other members' executors as rows of
  ``cronoq_attempts`` (state ``offered``); the member claims them
  (``started``), runs them and writes the outcome (``done``), or gives them
  back unstarted (``returned``); the leader reads those, reports them to its
  engine and deletes the rows. The leader cancels an attempt by setting
  ``cancelled``.

``ClusterTransport`` does that SQL for one process, one *cycle* at a time:
the writes queued since the last cycle (at most two transactions: the
member's, and the leader's, which checks its fencing epoch first), then the
reads the process needs now. It runs on a thread of its own with a
connection of its own, so the engine's commits never wait behind it.

PostgreSQL wakes the processes concerned by ``NOTIFY`` on one channel per
schema (payload: ``leader`` or a member's id); SQLite has no such thing, so
processes poll, and skip the reads when ``PRAGMA data_version`` says no
other connection wrote since the last ones.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from ..realtime import real_time_ns

__all__ = ["ClusterTransport", "Outgoing", "Wants", "Incoming", "Offer", "Claimed", "Report", "Request",
           "MemberRow", "channel_name"]

log = logging.getLogger("cronoq.store")

_CHUNK = 500


def channel_name(schema: str) -> str:
    """The PostgreSQL ``NOTIFY`` channel of the processes sharing ``schema``."""
    return "cronoq_" + hashlib.sha256(f"cronoq:cluster:{schema}".encode()).hexdigest()[:16]


@dataclass(slots=True)
class Offer:
    """An attempt the leader leases to another member."""

    lease: int
    member: str
    task_id: int
    pool: str
    attempt: int
    record: str      # JSON text
    payload: bytes


@dataclass(slots=True)
class Claimed:
    """An attempt this member claimed (it is now ``started``)."""

    lease: int
    epoch: int
    task_id: int
    pool: str
    attempt: int
    record: str
    payload: bytes


@dataclass(slots=True)
class Report:
    """What became of a leased attempt: ``done`` (with its outcome) or ``returned`` (unstarted)."""

    lease: int
    member: str
    state: str
    outcome: str | None
    output: bytes | None
    message: str | None
    retry_after_ns: int | None


@dataclass(slots=True)
class Request:
    """An inbox row the leader has not answered."""

    seq: int
    member: str
    kind: str
    body: str
    payload: bytes | None


@dataclass(slots=True)
class MemberRow:
    id: str
    pools: str
    state: str
    heartbeat_ns: int


@dataclass
class Outgoing:
    """The writes of one cycle."""

    beat: tuple[str, str] | None = None          # (pools as JSON, state): renew the member row
    leave: bool = False                          # delete the member row
    requests: list[tuple[int, str, str, bytes | None]] = field(default_factory=list)  # (token, kind, body, payload)
    forget: list[int] = field(default_factory=list)          # inbox rows read: delete them
    outcomes: list[tuple[int, str, bytes | None, str | None, int | None]] = field(default_factory=list)
    returns: list[int] = field(default_factory=list)         # claimed, never started: give back
    heartbeats: list[int] = field(default_factory=list)      # leases whose executor heartbeated
    # The leader's (under its epoch):
    epoch: int | None = None
    answers: list[tuple[int, str]] = field(default_factory=list)   # (seq, answer JSON)
    offers: list[Offer] = field(default_factory=list)
    cancels: list[int] = field(default_factory=list)
    purge: list[int] = field(default_factory=list)           # attempt rows reported: delete them
    take_back: list[int] = field(default_factory=list)       # offers to withdraw if still unclaimed

    def member_writes(self) -> bool:
        return bool(self.beat or self.leave or self.requests or self.forget or self.outcomes
                    or self.returns or self.heartbeats)

    def leader_writes(self) -> bool:
        return bool(self.answers or self.offers or self.cancels or self.purge or self.take_back)


@dataclass
class Wants:
    """The reads of one cycle."""

    answers: list[int] = field(default_factory=list)     # inbox seqs awaiting an answer
    claim: bool = False                                  # claim offers made to this member
    cancelled: bool = False                              # this member runs leased attempts: any cancelled?
    tasks: list[int] = field(default_factory=list)       # watched task ids: their ends
    lead: bool = False                                   # the leader's reads (inbox, reports)
    inbox: bool = True                                   # leader: read the calls (not once it stops)
    cursor: int = 0                                      # inbox rows past this seq
    heartbeats_since: int | None = None                  # leader: heartbeats of leased attempts after this
    members: bool = False
    takeover: int | None = None                          # a new leader's epoch: clear older attempts
    force: bool = False                                  # read even if nothing changed


@dataclass
class Incoming:
    """What one cycle read (and learned from its writes)."""

    seqs: dict[int, int] = field(default_factory=dict)   # request token -> inbox seq
    fenced: str | None = None
    vanished: list[int] = field(default_factory=list)    # answered rows already deleted
    taken_back: list[int] = field(default_factory=list)  # offers withdrawn unclaimed
    answers: dict[int, str] = field(default_factory=dict)
    claimed: list[Claimed] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)
    finished: list[tuple[int, str, int, str | None, bytes | None]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)
    heartbeats: list[tuple[int, int]] = field(default_factory=list)   # (lease, heartbeat_ns)
    members: list[MemberRow] | None = None
    stale: list[tuple[int, int]] = field(default_factory=list)        # takeover: (lease, task id) of older epochs
    read: bool = False                                   # the reads ran (something had changed)
    error: BaseException | None = None                   # the leader's writes or the reads failed
    leader_written: bool = False                         # the leader's writes were committed


def _data_version(conn: Any) -> int:
    """SQLite's count of commits made by other connections, as ``conn`` sees it."""
    cur = conn.cursor()
    try:
        cur.execute("PRAGMA data_version")
        return int(cur.fetchone()[0])
    finally:
        cur.close()


class ClusterTransport:
    """The cluster's SQL for one process (see the module documentation).

    Made by ``SqlStore.cluster_transport()``; every method but ``wake_on``
    and ``close`` runs on the caller's thread (the runtime calls them from
    a worker thread of its own) with one connection of its own.
    """

    def __init__(self, *, dialect: str, identity: str, host: str, pid: int,
                 connect: Callable[[], Any], quote_table: Callable[[str], str], placeholder: str,
                 errors: tuple[type[BaseException], ...], listen: Callable[[], Any] | None = None,
                 channel: str | None = None, generation: Callable[[], int] | None = None) -> None:
        self.dialect = dialect
        self.identity = identity
        self.host = host
        self.pid = pid
        self.errors = errors
        self._connect = connect
        self._listen = listen
        self._channel = channel
        # SQLite: changes when the store opened another file at its path (the old one was deleted).
        self._generation = generation
        self._seen_generation = generation() if generation is not None else 0
        self._conn: Any = None
        self._version: int | None = None
        self._probe: Any = None                 # SQLite: a connection for unchanged() (the loop's)
        self._probe_version: int | None = None
        self._listener: threading.Thread | None = None
        self._closing = threading.Event()
        p = placeholder
        self._p = p
        t = {name: quote_table(name) for name in ("cronoq_members", "cronoq_inbox", "cronoq_attempts",
                                                   "cronoq_meta", "cronoq_tasks")}
        members, inbox, attempts, meta, tasks = (t["cronoq_members"], t["cronoq_inbox"], t["cronoq_attempts"],
                                                 t["cronoq_meta"], t["cronoq_tasks"])
        self._attempts = attempts
        self.sql = {
            "beat": (f"INSERT INTO {members} (id, pid, host, pools, state, started_ns, heartbeat_ns) "
                     f"VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}) ON CONFLICT (id) DO UPDATE SET "
                     f"pools = excluded.pools, state = excluded.state, heartbeat_ns = excluded.heartbeat_ns"),
            "leave": f"DELETE FROM {members} WHERE id = {p}",
            "request": (f"INSERT INTO {inbox} (member, kind, body, payload, created_ns) "
                        f"VALUES ({p}, {p}, {p}, {p}, {p}) RETURNING seq"),
            # A member touches only its own rows (by seq or lease), even on a database other
            # than the one that numbered them (SQLite: a file replaced at the store's path).
            "forget": f"DELETE FROM {inbox} WHERE seq = {p} AND member = {p}",
            "withdraw": f"DELETE FROM {inbox} WHERE seq = {p} AND member = {p} AND answer IS NULL",
            "outcome": (f"UPDATE {attempts} SET state = 'done', outcome = {p}, output = {p}, message = {p}, "
                        f"retry_after_ns = {p}, updated_ns = {p} "
                        f"WHERE lease = {p} AND member = {p} AND state IN ('started', 'cancelled')"),
            "return": (f"UPDATE {attempts} SET state = 'returned', updated_ns = {p} "
                       f"WHERE lease = {p} AND member = {p} AND state IN ('offered', 'started', 'cancelled')"),
            "heartbeat": (f"UPDATE {attempts} SET heartbeat_ns = {p} "
                          f"WHERE lease = {p} AND member = {p} AND state = 'started'"),
            # PostgreSQL: a new leader's epoch bump waits until this transaction ends.
            "epoch": f"SELECT epoch FROM {meta} WHERE id = 1" + (" FOR SHARE" if dialect == "postgresql" else ""),
            "answer": f"UPDATE {inbox} SET answer = {p}, answered_ns = {p} WHERE seq = {p} AND answer IS NULL",
            "offer": (f"INSERT INTO {attempts} (lease, epoch, member, task_id, pool, attempt, record, payload, "
                      f"state, updated_ns) VALUES ({p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, 'offered', {p}) "
                      f"ON CONFLICT (lease) DO NOTHING"),
            "cancel": (f"UPDATE {attempts} SET state = 'cancelled', updated_ns = {p} "
                       f"WHERE lease = {p} AND state IN ('offered', 'started')"),
            "purge": f"DELETE FROM {attempts} WHERE lease = {p}",
            "take_back": (f"UPDATE {attempts} SET state = 'returned', updated_ns = {p} "
                          f"WHERE lease = {p} AND state = 'offered' RETURNING lease"),
            "answers": f"SELECT seq, answer FROM {inbox} WHERE member = {p} AND answer IS NOT NULL AND seq IN ",
            "any_offer": f"SELECT 1 FROM {attempts} WHERE member = {p} AND state = 'offered' LIMIT 1",
            "claim": (f"UPDATE {attempts} SET state = 'started', updated_ns = {p} "
                      f"WHERE member = {p} AND state = 'offered' AND epoch = (SELECT epoch FROM {meta} WHERE id = 1) "
                      f"RETURNING lease, epoch, task_id, pool, attempt, record, payload"),
            "cancelled": f"SELECT lease FROM {attempts} WHERE member = {p} AND state = 'cancelled'",
            "finished": (f"SELECT id, status, attempt, message, output FROM {tasks} "
                         f"WHERE finished_ns IS NOT NULL AND id IN "),
            "inbox": (f"SELECT seq, member, kind, body, payload FROM {inbox} "
                      f"WHERE seq > {p} AND answer IS NULL ORDER BY seq LIMIT 1000"),
            "reports": (f"SELECT lease, member, state, outcome, output, message, retry_after_ns FROM {attempts} "
                        f"WHERE state IN ('done', 'returned')"),
            "beats": (f"SELECT lease, heartbeat_ns FROM {attempts} "
                      f"WHERE state = 'started' AND heartbeat_ns > {p}"),
            "members": f"SELECT id, pools, state, heartbeat_ns FROM {members}",
            "stale": (f"SELECT lease, task_id FROM {attempts} WHERE epoch < {p} "
                      f"AND state IN ('offered', 'started')"),
            "stale_cancel": (f"UPDATE {attempts} SET state = 'cancelled', updated_ns = {p} "
                             f"WHERE epoch < {p} AND state IN ('offered', 'started')"),
            "stale_purge": f"DELETE FROM {attempts} WHERE epoch < {p} AND state IN ('done', 'returned')",
            "old_members": f"DELETE FROM {members} WHERE heartbeat_ns < {p}",
            "old_answers": f"DELETE FROM {inbox} WHERE answered_ns < {p}",
            "notify": "SELECT pg_notify(%s, %s)",
        }

    # ----------------------------------------------------------- plumbing

    def _connection(self) -> Any:
        conn = self._conn
        if conn is None:
            conn = self._conn = self._connect()
        return conn

    def _follow_file(self) -> None:
        """Drop the connections to a file the store no longer uses (on the worker thread)."""
        if self._generation is None:
            return
        current = self._generation()
        if current != self._seen_generation:
            self._seen_generation = current
            self._drop()
            self._drop_probe()

    def _drop_probe(self) -> None:
        probe, self._probe = self._probe, None
        self._probe_version = None
        if probe is not None:
            try:
                probe.close()
            except Exception:
                pass

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._version = None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass

    def unchanged(self) -> bool:
        """SQLite, on the caller's thread (the runtime's loop): True if no
        other connection wrote to the file since the last call, read from a
        connection of its own (``PRAGMA data_version``: shared memory, no
        I/O). False elsewhere, and whenever unsure."""
        conn = self._probe
        if conn is None or self._closing.is_set():
            return False
        if self._generation is not None and self._generation() != self._seen_generation:
            return False   # another file: the worker thread reconnects first
        try:
            version = _data_version(conn)
        except self.errors:
            self._probe_version = None
            return False
        same = version == self._probe_version
        self._probe_version = version
        return same

    def _open_probe(self) -> None:
        """The connection of ``unchanged()``, opened here (the worker thread)
        so the loop never waits for a connection to be made."""
        if self.dialect == "sqlite" and self._probe is None and not self._closing.is_set():
            self._probe = self._connect()

    def _begin_write(self, cursor: Any) -> None:
        if self.dialect == "sqlite":
            cursor.execute("BEGIN IMMEDIATE")

    def _in(self, count: int) -> str:
        return "(" + ", ".join([self._p] * count) + ")"

    # ----------------------------------------------------------- one cycle

    def cycle(self, out: Outgoing, want: Wants) -> Incoming:
        """Write ``out`` and read what ``want`` asks.

        The member's writes come first, in a transaction of their own: if
        they fail, the error propagates and nothing was written (send them
        again). Once they are committed, a failure of the leader's writes
        or of the reads does not raise: it is in ``Incoming.error`` (the
        leader's writes were not made), so the answer to the member's writes
        (the inbox seqs) is never lost. The connection is dropped after any
        failure; the next cycle reconnects."""
        got = Incoming()
        now = real_time_ns()
        self._follow_file()
        if self._probe is None:
            try:
                self._open_probe()
            except self.errors:   # the cycles run without it: unchanged() stays False
                pass
        try:
            self._member_writes(out, got, now)
        except BaseException:
            self._drop()
            raise
        try:
            if out.leader_writes() or want.takeover is not None:
                self._leader_writes(out, want, got, now)
            if got.fenced is None:
                self._read(self._connection(), want, got, now)
        except self.errors as exc:
            self._drop()
            got.error = exc
        return got

    def _member_writes(self, out: Outgoing, got: Incoming, now: int) -> None:
        if not out.member_writes():
            return
        sql = self.sql
        conn = self._connection()
        notify: set[str] = set()
        cur = conn.cursor()
        try:
            self._begin_write(cur)
            if out.beat is not None:
                cur.execute(sql["beat"], (self.identity, self.pid, self.host, out.beat[0], out.beat[1], now, now))
            for token, kind, body, payload in out.requests:
                cur.execute(sql["request"], (self.identity, kind, body, payload, now))
                got.seqs[token] = int(cur.fetchone()[0])
            if out.requests:
                notify.add("leader")
            if out.forget:
                cur.executemany(sql["forget"], [(seq, self.identity) for seq in out.forget])
            if out.outcomes:
                cur.executemany(sql["outcome"], [(o, data, m, r, now, lease, self.identity)
                                                 for lease, o, data, m, r in out.outcomes])
                notify.add("leader")
            if out.returns:
                cur.executemany(sql["return"], [(now, lease, self.identity) for lease in out.returns])
                notify.add("leader")
            if out.heartbeats:
                cur.executemany(sql["heartbeat"], [(now, lease, self.identity) for lease in out.heartbeats])
            if out.leave:
                cur.execute(sql["leave"], (self.identity,))
            self._notify(cur, notify)
        finally:
            cur.close()
        conn.commit()

    def _leader_writes(self, out: Outgoing, want: Wants, got: Incoming, now: int) -> None:
        sql = self.sql
        conn = self._connection()
        notify: set[str] = set()
        cur = conn.cursor()
        try:
            self._begin_write(cur)
            cur.execute(sql["epoch"])
            epoch = int(cur.fetchone()[0])
            mine = out.epoch if out.epoch is not None else want.takeover
            if mine is not None and epoch != mine:
                conn.rollback()
                got.fenced = f"epoch {mine} was replaced by epoch {epoch}"
                return
            if want.takeover is not None:
                cur.execute(sql["stale"], (want.takeover,))
                got.stale = [(int(r[0]), int(r[1])) for r in cur.fetchall()]
                notify.update(self._members_of(cur, [lease for lease, _ in got.stale]))
                cur.execute(sql["stale_cancel"], (now, want.takeover))
                cur.execute(sql["stale_purge"], (want.takeover,))
            for seq, answer in out.answers:
                cur.execute(sql["answer"], (answer, now, seq))
                if cur.rowcount == 0:
                    got.vanished.append(seq)
            if out.answers:
                notify.add("answers")
            if out.offers:
                cur.executemany(sql["offer"], [(o.lease, out.epoch, o.member, o.task_id, o.pool, o.attempt,
                                                o.record, o.payload, now) for o in out.offers])
                notify.update(o.member for o in out.offers)
            if out.cancels:
                notify.update(self._members_of(cur, out.cancels))
                cur.executemany(sql["cancel"], [(now, lease) for lease in out.cancels])
            for lease in out.take_back:
                cur.execute(sql["take_back"], (now, lease))
                if cur.fetchone() is not None:
                    got.taken_back.append(lease)
            if out.purge:
                cur.executemany(sql["purge"], [(lease,) for lease in out.purge])
            self._notify(cur, notify)
        finally:
            cur.close()
        conn.commit()
        got.leader_written = True

    def _members_of(self, cur: Any, leases: list[int]) -> set[str]:
        if not leases or self.dialect != "postgresql":
            return set()
        found: set[str] = set()
        table = self._attempts
        for i in range(0, len(leases), _CHUNK):
            chunk = leases[i:i + _CHUNK]
            cur.execute(f"SELECT DISTINCT member FROM {table} WHERE lease IN {self._in(len(chunk))}", chunk)
            found.update(row[0] for row in cur.fetchall())
        return found

    def _notify(self, cur: Any, targets: set[str]) -> None:
        if self._channel is None or not targets:
            return
        for target in targets:
            cur.execute(self.sql["notify"], (self._channel, target))

    def _changed(self, conn: Any) -> bool:
        """SQLite: whether another connection wrote since the last reads."""
        if self.dialect != "sqlite":
            return True
        version = _data_version(conn)
        changed = version != self._version
        self._version = version
        return changed

    def _read(self, conn: Any, want: Wants, got: Incoming, now: int) -> None:
        sql = self.sql
        if not self._changed(conn) and not want.force and want.takeover is None:
            return
        got.read = True
        cur = conn.cursor()
        try:
            if want.claim:
                cur.execute(sql["any_offer"], (self.identity,))
                offered = cur.fetchone() is not None
                if self.dialect != "sqlite":
                    conn.commit()
                if offered:
                    self._begin_write(cur)
                    cur.execute(sql["claim"], (now, self.identity))
                    got.claimed = [Claimed(int(r[0]), int(r[1]), int(r[2]), r[3], int(r[4]), r[5], bytes(r[6]))
                                   for r in cur.fetchall()]
                    conn.commit()
            for i in range(0, len(want.answers), _CHUNK):
                chunk = want.answers[i:i + _CHUNK]
                cur.execute(sql["answers"] + self._in(len(chunk)), [self.identity, *chunk])
                got.answers.update((int(r[0]), r[1]) for r in cur.fetchall())
            if want.cancelled:
                cur.execute(sql["cancelled"], (self.identity,))
                got.cancelled = [int(r[0]) for r in cur.fetchall()]
            for i in range(0, len(want.tasks), _CHUNK):
                chunk = want.tasks[i:i + _CHUNK]
                cur.execute(sql["finished"] + self._in(len(chunk)), chunk)
                got.finished.extend((int(r[0]), r[1], int(r[2]), r[3], None if r[4] is None else bytes(r[4]))
                                    for r in cur.fetchall())
            if want.lead:
                if want.inbox:
                    cur.execute(sql["inbox"], (want.cursor,))
                    got.requests = [Request(int(r[0]), r[1], r[2], r[3],
                                            None if r[4] is None else bytes(r[4])) for r in cur.fetchall()]
                cur.execute(sql["reports"])
                got.reports = [Report(int(r[0]), r[1], r[2], r[3], None if r[4] is None else bytes(r[4]), r[5],
                                      None if r[6] is None else int(r[6])) for r in cur.fetchall()]
                if want.heartbeats_since is not None:
                    cur.execute(sql["beats"], (want.heartbeats_since,))
                    got.heartbeats = [(int(r[0]), int(r[1])) for r in cur.fetchall()]
            if want.members:
                cur.execute(sql["members"])
                got.members = [MemberRow(r[0], r[1], r[2], int(r[3])) for r in cur.fetchall()]
        finally:
            cur.close()
        if self.dialect != "sqlite":
            conn.commit()   # end the read snapshot

    def withdraw(self, seqs: list[int]) -> list[int]:
        """Delete the inbox rows ``seqs`` that no leader answered yet; returns
        those deleted (their calls were never carried out)."""
        self._follow_file()
        try:
            conn = self._connection()
            cur = conn.cursor()
            deleted: list[int] = []
            try:
                self._begin_write(cur)
                for seq in seqs:
                    cur.execute(self.sql["withdraw"], (seq, self.identity))
                    if cur.rowcount:
                        deleted.append(seq)
            finally:
                cur.close()
            conn.commit()
            return deleted
        except BaseException:
            self._drop()
            raise

    def tidy(self, members_before_ns: int, answers_before_ns: int) -> None:
        """Delete member rows not renewed since ``members_before_ns`` and
        answers no follower collected since ``answers_before_ns``."""
        self._follow_file()
        try:
            conn = self._connection()
            cur = conn.cursor()
            try:
                self._begin_write(cur)
                cur.execute(self.sql["old_members"], (members_before_ns,))
                cur.execute(self.sql["old_answers"], (answers_before_ns,))
            finally:
                cur.close()
            conn.commit()
        except BaseException:
            self._drop()
            raise

    # ----------------------------------------------------------- waking up

    def wake_on(self, wake: Callable[[str], None]) -> bool:
        """PostgreSQL: call ``wake(payload)`` (from a thread of its own) for
        every notification on the channel, and ``wake("")`` after the
        listening connection failed and came back (something may have been
        missed). False where the database cannot notify (SQLite: poll)."""
        if self._listen is None or self._channel is None:
            return False
        thread = threading.Thread(target=self._listen_thread, args=(wake,), name="cronoq-listen", daemon=True)
        self._listener = thread
        thread.start()
        return True

    def _listen_thread(self, wake: Callable[[str], None]) -> None:
        assert self._listen is not None
        failed = False
        while not self._closing.is_set():
            try:
                conn = self._listen()
            except Exception:
                failed = True
                self._closing.wait(1.0)
                continue
            try:
                conn.execute(f'LISTEN "{self._channel}"')
                if failed:
                    wake("")
                    failed = False
                while not self._closing.is_set():
                    for note in conn.notifies(timeout=0.5):
                        wake(note.payload)
            except Exception:
                failed = True
                self._closing.wait(0.5)
            finally:
                try:
                    conn.close()
                except Exception:
                    pass

    def close(self) -> None:
        """Stop listening and release the connections (the worker thread calls it last)."""
        self._closing.set()
        self._drop()
        self._drop_probe()
