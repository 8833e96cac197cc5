"""Leadership: which backend a scheduler's calls go to, and every change of it.

- Without a store, the scheduler runs its engine from the start.
- With a store of its own, it waits to lead (a standby waits here), takes a
  new epoch, recovers, and runs the engine; leadership lost, it stops.
- With a store shared by processes (``store.cluster``), it leads at once if
  no one does, else follows (``FollowerBackend``) and tries to lead in the
  background (*lead later*); leadership lost, it follows again (*demote*)
  and tries again. While leading, it serves the other processes' calls
  through the table of ``cronoq.runtime.operations``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from .. import realtime
from ..core.engine import Core
from ..core.errors import CheckpointError, SchedulerError
from ..core.types import CoreConfig, ResourceConfig
from ..store.base import ClusterStore, Fenced, LeaderUnavailable, Store, StoreRejected, StoreUnavailable
from . import operations as ops
from . import process as _process
from .backend import Backend
from .checkpoints import CheckpointBook
from .cluster import Cluster, ClusterRunner
from .durability import DurableLog, EncodedPayloads
from .engine_backend import EngineBackend
from .following import FollowerBackend
from .lifecycle import RUNNING, SERVING, STOPPING, cancel_and_wait
from .pool import Pool
from .recovery import recover
from .runner import ABORT_SHUTDOWN, Attempt, Runner

if TYPE_CHECKING:
    from .driver import EngineDriver

__all__ = ["Leadership"]

log = logging.getLogger("cronoq.scheduler")


class Leadership:
    def __init__(self, engine: EngineBackend, pools: Sequence[Pool], resources: Sequence[ResourceConfig],
                 config: CoreConfig, store: Store | None, payloads: EncodedPayloads, checkpoints: CheckpointBook,
                 on_swap: Callable[[Backend], None]) -> None:
        self.engine = engine
        self.driver: EngineDriver = engine.driver
        self.life = engine.life
        self.pools = list(pools)
        self.resources = list(resources)
        self.config = config
        self.store = store
        self.payloads = payloads
        self.codec = payloads.codec
        self.checkpoints = checkpoints
        self._on_swap = on_swap
        self.backend: Backend = engine
        self.epoch = 0
        self.lost_reason: str | None = None
        self.cluster: Cluster | None = None
        self._lead_task: asyncio.Task[None] | None = None
        self._handlers: dict[tuple[str, int], ops.Handler] = {
            ops.SUBMIT.key: self._serve_submit,
            ops.CANCEL.key: lambda ref: self.backend.cancel(ref),
            ops.INFO.key: lambda ref: self.backend.info(ref),
            ops.EXPLAIN.key: lambda ref: self.backend.explain(ref),
            ops.DEPENDENTS.key: lambda ref: self.backend.dependents(ref),
            ops.SNAPSHOT.key: lambda _: self.backend.snapshot(),
            ops.RESERVATIONS.key: lambda args: self.backend.reservations(args.ahead_ns, args.pools),
            ops.SET_CAPACITY.key: lambda args: self.backend.set_capacity(*args),
            ops.SET_GROUP_CAPACITY.key: lambda args: self.backend.set_group_capacity(*args),
            ops.ADD_RECURRING.key: lambda args: self.engine.add_recurring(args),
            ops.REMOVE_RECURRING.key: lambda name: self.backend.remove_recurring(name),
            ops.CHECKPOINT.key: self._save_for_member,
        }

    def _use(self, backend: Backend) -> None:
        self.backend = backend
        self._on_swap(backend)

    # ------------------------------------------------------------ start

    async def start(self) -> None:
        """Start as the store allows (see the module documentation)."""
        store = self.store
        driver = self.driver
        if store is not None and getattr(store, "cluster", False) is True:
            await self._start_cluster(cast(ClusterStore, store))
            return
        if store is not None:
            await self._start_durable(store)
        else:
            driver.core = Core(self.config, [p.config for p in self.pools], self.resources,
                               now=driver.clock.now_ns())
            driver.forget_siblings = _process.note_in_memory([p.name for p in self.pools], log)
        driver.use_runners({p.name: driver.make_runner(p) for p in self.pools})
        with driver.lock:
            self.life.state = RUNNING
            driver.leading = True
            driver.pump()

    async def _start_durable(self, store: Store) -> None:
        """Lead (a standby waits here, until shutdown() gives up), take a new
        epoch, recover, restore. If anything fails after leading, step down."""
        loop = self.life.loop
        assert loop is not None   # start() bound it
        self.life.abort_start = abort = loop.create_future()
        acquire = self.life.tasks.spawn(store.acquire_leadership())
        try:
            await asyncio.wait((acquire, abort), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not acquire.done():
                acquire.cancel()
        if not acquire.done() or acquire.cancelled():
            raise SchedulerError("the scheduler was shut down while it waited to lead")
        self.epoch = acquire.result()
        try:
            await self._recover()
            if abort.done():
                raise SchedulerError("the scheduler was shut down while it recovered")
        except BaseException:
            try:
                await store.release_leadership()
            except Exception as exc:
                log.error("could not release leadership: %s", exc, extra={"action": "store_outage"})
            raise

    async def _recover(self) -> None:
        store = self.store
        assert store is not None
        driver = self.driver
        core = await recover(store, self.codec, self.config, self.epoch, self.pools, self.resources,
                             driver.clock.now_ns(), self.checkpoints)
        driver.core = core
        driver.log = DurableLog(driver.durable_hooks(self.lost), store, self.payloads, self.epoch,
                                float(store.commit_timeout), self.life.tasks)
        self.checkpoints.durable = self._save_checkpoint
        store.on_lost(self.lost_threadsafe)

    def _forget_engine(self) -> None:
        self.driver.core = None
        self.driver.log = None

    async def _start_cluster(self, store: ClusterStore) -> None:
        """Join the store's processes: lead at once if the store has no leader
        (recovering first), else follow and try to lead in the background."""
        loop = self.life.loop
        assert loop is not None
        driver = self.driver
        transport = await store.cluster_transport()
        cluster = Cluster(transport, self.codec, pools=[p.name for p in self.pools if p.runner is None],
                          request_timeout=float(store.request_timeout), poll=float(store.cluster_poll),
                          heartbeat=float(store.member_heartbeat), member_ttl=float(store.member_ttl),
                          payloads=self.payloads, tasks=self.life.tasks)
        self.cluster = cluster
        cluster.start(loop)
        for pool in self.pools:
            if pool.runner is None:
                cluster.member_link(pool.name, functools.partial(driver.executor_runner, pool),
                                    checkpoints=self.checkpoints)
        self.life.abort_start = abort = loop.create_future()
        epoch: int | None = None
        try:
            try:
                epoch = await store.try_leadership()
            except StoreUnavailable as exc:   # busy, say: follow, and try again in the background
                log.warning("could not try to lead at start: %s", exc, extra={"action": "store_outage"})
            if epoch is not None:
                self.epoch = epoch
                try:
                    await self._recover()
                    if abort.done():
                        raise SchedulerError("the scheduler was shut down while it recovered")
                except BaseException:
                    await self._release_quietly()
                    raise
        except BaseException:
            self.cluster = None
            self._forget_engine()
            await cluster.stop(0.0)
            raise
        follower = FollowerBackend(self.life, cluster, self.payloads, driver.clock, self._leave)
        with driver.lock:
            if epoch is None:
                self._use(follower)   # before any call can see it running
            self.life.state = RUNNING
            if epoch is not None:
                self._become_leader()
            else:
                self._lead_task = self.life.tasks.spawn(self._lead_later())

    async def _release_quietly(self) -> None:
        assert self.store is not None
        try:
            await self.store.release_leadership()
        except Exception as exc:
            log.error("could not release leadership: %s", exc, extra={"action": "store_outage"})

    # ------------------------------------------------------------ lead, demote, lead later

    def _become_leader(self) -> None:
        """Under the lock, recovered: run the engine from now on."""
        cluster = self.cluster
        driver = self.driver
        assert cluster is not None
        driver.use_runners({p.name: self._cluster_runner(p, cluster) for p in self.pools})
        driver.leading = True
        self.engine.cluster = cluster
        self._use(self.engine)
        cluster.lead(self.epoch, self.serve, self.lost_threadsafe)
        driver.pump()

    def _cluster_runner(self, pool: Pool, cluster: Cluster) -> Runner:
        link = self.driver.engine_link(pool)
        if pool.runner is not None:
            return pool.runner(link)
        codec = self.codec

        def encode(attempt: Attempt) -> bytes:
            data: bytes = codec.encode(attempt.payload)
            return data

        return ClusterRunner(link, cluster, encode, self.driver.give_back,
                             heartbeats=pool.config.lease_ttl_ns is not None)

    async def _lead_later(self) -> None:
        """A follower's background: wait for the store's leadership, recover, lead."""
        store = self.store
        assert store is not None
        logged = False
        while self.life.state is RUNNING:
            try:
                epoch = await store.acquire_leadership()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if getattr(store, "closed", False):
                    log.error("the store was closed while this scheduler follows: it will never lead",
                              extra={"action": "store_outage"})
                    return
                if not logged:
                    log.warning("waiting to lead: %s", exc, extra={"action": "store_outage"})
                    logged = True
                await realtime.sleep(1.0)
                continue
            self.epoch = epoch
            try:
                await self._recover()
            except asyncio.CancelledError:
                self._forget_engine()
                await self._release_quietly()
                raise
            except Exception as exc:
                log.error("could not recover after taking the lead: %s", exc, extra={"action": "store_outage"})
                self._forget_engine()
                await self._release_quietly()
                await realtime.sleep(1.0)
                continue
            with self.driver.lock:
                if self.life.state is RUNNING:
                    self._become_leader()
                    return
            self._forget_engine()
            await self._release_quietly()
            return

    def _demote(self, reason: str) -> None:
        """Under the lock: leadership is lost, but this process goes on as a
        follower; waiting handles are resolved from the store."""
        cluster = self.cluster
        driver = self.driver
        core = driver.core
        assert cluster is not None and core is not None
        log.error("leadership lost: %s; this process follows from now on", reason,
                  extra={"action": "leader_lost", "epoch": self.epoch})
        driver.leading = False
        core.stop_dispatching()
        self._fail_in_flight(SchedulerError(
            f"this process lost the lead ({reason}); call again: another process leads"))
        for lease in list(core.running):
            driver.abort(lease, ABORT_SHUTDOWN)
        cluster.leader.step_down()
        driver.stop_timer()
        driver.timer_at = None
        for handle in self.engine.results.take_handles():
            cluster.watch(handle)
        self._forget_engine()
        driver.use_runners({})
        self.engine.cluster = None
        self._use(FollowerBackend(self.life, cluster, self.payloads, driver.clock, self._leave))
        self.lost_reason = reason
        self._lead_task = self.life.tasks.spawn(self._lead_again())

    async def _lead_again(self) -> None:
        await self._release_quietly()   # whatever the store still holds of the lost lead
        await self._lead_later()

    def lost_threadsafe(self, reason: str) -> None:
        loop = self.life.loop
        if loop is None or loop.is_closed():
            return
        if self.life.on_loop():
            self.lost(reason)
        else:
            loop.call_soon_threadsafe(self.lost, reason)

    def lost(self, reason: str) -> None:
        """Leadership is gone (fenced, lease lost): stop at once, write nothing
        more (with processes sharing the store: follow from now on)."""
        driver = self.driver
        with driver.lock:
            state = self.life.state
            if state not in SERVING:
                return
            if self.cluster is not None and state is RUNNING:
                if driver.leading:
                    self._demote(reason)
                return
            log.error("leadership lost: %s", reason, extra={"action": "leader_lost", "epoch": self.epoch})
            self.life.state = STOPPING
            core = driver.core
            assert core is not None
            core.stop_dispatching()
            self._fail_in_flight(SchedulerError(
                f"this scheduler lost leadership ({reason}); another one serves now"))
        for runner in driver.runners.values():
            runner.cancel_all()
        driver.finish()
        self.lost_reason = reason

    def _fail_in_flight(self, error: SchedulerError) -> None:
        """Leadership is gone: submitters waiting for room and commits not yet
        acknowledged get ``error``; nothing more is written."""
        self.engine.admission.fail_waiters(error)
        log_ = self.driver.log
        if log_ is not None:
            log_.fail_all(error)
            log_.discard_open()

    async def _save_checkpoint(self, task_id: int, stage: str, data: bytes, attempt: int, at_ns: int) -> None:
        """Write a checkpoint to the store, fenced by this leader's epoch."""
        assert self.store is not None
        try:
            await self.store.save_checkpoint(self.epoch, task_id, stage, data, attempt, at_ns)
        except Fenced as exc:
            self.lost(f"fenced: {exc}")
            raise

    # ------------------------------------------------------------ a follower leaves

    async def _leave(self, grace: float) -> None:
        """A follower's shutdown: the attempts leased to it get ``grace``;
        those it never started go back to the leader (no attempt used)."""
        driver = self.driver
        with driver.lock:
            self.life.state = STOPPING
        task, self._lead_task = self._lead_task, None
        await cancel_and_wait(task)
        if driver.leading:   # it took the lead just before the cancel: shut down as the leader
            with driver.lock:
                self.life.state = RUNNING
            await self.engine.shutdown(grace)
            return
        cluster = self.cluster
        assert cluster is not None
        await cluster.stop(grace)
        driver.finish()

    # ------------------------------------------------------------ serving the other processes

    async def serve(self, kind: str, body: dict[str, Any], payloads: list[bytes]) -> Any:
        """The leader carries out a follower's call (admission first, in inbox
        order). A call refused because this leader stops (nothing of it was
        carried out) raises ``LeaderUnavailable``: the cluster leaves it in the
        inbox for the next leader instead of answering."""
        try:
            return await ops.serve(self._handlers, kind, body, payloads, self.payloads)
        except SchedulerError as exc:
            if (self.life.state is RUNNING and self.driver.leading) or isinstance(exc, StoreRejected) \
                    or getattr(exc, "uncertain", False):
                raise   # a refusal of the call itself, or a commit that may have been made
            raise LeaderUnavailable(f"the leader stops and did not carry out the call: {exc}") from exc

    async def _serve_submit(self, args: ops.SubmitArgs) -> list[tuple[int, bool]]:
        backend = self.backend
        if args.batch:
            return await backend.enqueue_batch(args.specs)
        pair: tuple[int, bool] = await backend.submit_spec(args.specs[0], False, None, True)
        return [pair]

    async def _save_for_member(self, args: ops.CheckpointArgs) -> float:
        """The leader saves the checkpoint of an attempt it leased to another
        process, if that attempt is still out there (its lease, task and
        attempt number match): as its own attempts' checkpoints, committed
        and fenced by its epoch before the member gets the answer."""
        cluster = self.cluster
        assert cluster is not None
        stage = args.stage
        attempt = cluster.leader.leased_attempt(args.lease, args.member)
        if attempt is None or attempt.id != args.task or attempt.attempt != args.attempt:
            raise CheckpointError(f"attempt {args.attempt} of task {args.task} is over (it ended, was "
                                  f"cancelled, given up, or placed by a leader that is gone): stage {stage!r} "
                                  f"was not saved")
        try:
            value = self.codec.decode(args.data)
        except Exception as exc:
            raise CheckpointError(f"the checkpoint of stage {stage!r} cannot be decoded by the leader's codec: "
                                  f"{type(exc).__name__}: {exc}") from None
        checkpoint = await self.checkpoints.save(attempt, stage, value)
        return checkpoint.at
