"""The server process: listeners, leadership, and a graceful stop.

``Server(config).run()`` binds the HTTP listener and a *standby* gRPC server
first, so probes and clients get answers at once (UNAVAILABLE, 503 on
/readyz; a standby closes each connection about ``standby_close_s`` after
accepting it, so a client behind a load balancer reaches another replica
when it retries). Then it waits to lead: with a store, ``Scheduler.start``
returns once this process holds the leadership. A leader swaps in the
serving gRPC server on the same port and serves until it is stopped
(SIGTERM, SIGINT: drain and exit 0) or loses its leadership (workers are
told ``Shutdown{not_leader}``, and the process stands by again).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import ssl
from typing import Any

import grpc
from grpc import aio

from ..core.types import CoreConfig, ResourceConfig, RetryPolicy
from ..runtime.pool import Pool
from ..runtime.scheduler import Scheduler
from .auth import Authenticator
from .codec import BlobCodec
from .config import LimitsConfig, PoolSection, ServerConfig
from .environment import check_environment
from .gateway import Gateway
from .grpc_api import add_services
from .counters import ServerCounters
from .http import HttpLimits, HttpListener
from .remote import WorkerHub
from .scalers import Scalers
from .service import Service
from .shards import ShardedService

__all__ = ["Server", "BindError"]

log = logging.getLogger("cronoq.server")


_ACCEPT_LOG_EVERY_S = 10.0


class BindError(RuntimeError):
    """A listener could not bind its address."""


def http_limits(limits: LimitsConfig) -> HttpLimits:
    return HttpLimits(max_connections=limits.max_http_connections, head_timeout_s=limits.http_head_timeout_s,
                      keepalive_timeout_s=limits.http_keepalive_timeout_s, body_timeout_s=limits.request_timeout_s,
                      write_timeout_s=limits.http_write_timeout_s)


def _check_file_limit(http_connections: int) -> None:
    """Raise the open-file limit to what the system allows, and warn when the
    HTTP connection cap does not fit under it (accepts would fail first)."""
    try:
        import resource
    except ImportError:   # not on this platform
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > soft):
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    if soft != resource.RLIM_INFINITY and http_connections + _FILES_RESERVED > soft:
        log.warning("the process may open %d files, fewer than limits.max_http_connections (%d per HTTP "
                    "listener) plus %d for everything else: new connections will fail at accept before the cap "
                    "answers 503; raise the limit (ulimit -n) or lower max_http_connections", soft,
                    http_connections, _FILES_RESERVED, extra={"action": "file_limit"})


_FILES_RESERVED = 256   # files for gRPC, the store, workers and logs beside the HTTP connections


def _pool(section: PoolSection, hub: WorkerHub) -> Pool:
    retry = None
    if section.retry is not None:
        r = section.retry
        retry = RetryPolicy(max_attempts=r.max_attempts, initial_backoff=r.initial_backoff_s,
                            multiplier=r.multiplier, max_backoff=r.max_backoff_s, jitter=r.jitter)
    # Capacity comes from connected workers only: the autoscaler asks for it (desired), never sets it.
    autoscale = section.autoscale.policy() if section.autoscale is not None else False
    return Pool(section.name, runner=hub.factory(section), min=section.min, max=section.max, initial=0,
                autoscale=autoscale, external_capacity=True,
                lease_ttl=section.lease_ttl_s, max_pending=section.max_pending, overflow=section.overflow,
                retry=retry, unknown_dependency=section.unknown_dependency,
                await_timeout=section.await_timeout_s, default_duration=section.default_duration_s,
                reservable_fraction=section.reservable_fraction, tenant_weights=section.tenant_weights,
                fair_share=section.fair_share)


class Server:
    def __init__(self, config: ServerConfig, *, insecure_no_auth: bool = False, handle_signals: bool = True) -> None:
        # With [[shards]]: this shard's pools, resources, schedules and store; the others' for routing.
        self.resource_shards = {r.name: r.shard for r in config.resources}
        self.config = config = config.for_shard()
        self.handle_signals = handle_signals
        self.serving = asyncio.Event()     # set while this process leads
        self.insecure_no_auth = insecure_no_auth or config.server.insecure_no_auth
        self.stopping: asyncio.Event | None = None
        self.grpc_port = 0
        self.http_port = 0
        self.metrics_port = 0
        self._grpc: aio.Server | None = None
        self.exit_code = 0
        self.counters = ServerCounters()
        self._accept_logged = -_ACCEPT_LOG_EVERY_S
        self._accept_unlogged = 0
        self._terms = 0   # stores made (one per term)

    # -- building blocks

    def _store(self) -> Any:
        # cluster=False: a server leads alone (a standby waits in start()); its
        # executors are the remote workers, not other server processes.
        store = self.config.store
        self._terms += 1
        if store.kind == "sqlite":
            from ..store.sqlite import SqliteStore
            assert store.path is not None
            # Only the first term may create the file: a later one that finds it missing
            # (deleted while this process had it open) waits for it to be put back.
            return SqliteStore(store.path, lease_ttl=store.lease_ttl_s, lease_renew=store.lease_renew_s,
                               lock_poll=store.lock_poll_s, retention=store.retention_s, full_sync=store.full_sync,
                               keep_finished=store.keep_finished_s, commit_timeout=store.commit_timeout_s,
                               cluster=False, create=self._terms == 1)
        if store.kind == "postgres":
            import os

            from ..store.postgres import PostgresStore
            url = store.url if store.url is not None else os.environ[store.url_env or "DATABASE_URL"]
            return PostgresStore(url, schema=store.schema, lock_poll=store.lock_poll_s, keepalive=store.keepalive_s,
                                 session_timeout=store.session_timeout_s, retention=store.retention_s,
                                 keep_finished=store.keep_finished_s, commit_timeout=store.commit_timeout_s,
                                 cluster=False)
        return None

    def _scheduler(self, hub: WorkerHub, store: Any) -> Scheduler:
        config = self.config
        resources = [ResourceConfig(r.name, r.kind, permits=r.permits, rate=r.rate, burst=r.burst)
                     for r in config.resources]
        core = CoreConfig(emit_transitions=True, max_pending_total=config.limits.max_pending_total,
                          retention=config.store.retention_s, shard=config.shard.number if config.shard else 0)
        return Scheduler([_pool(p, hub) for p in config.pools], resources, shutdown_grace=config.server.shutdown_grace_s,
                         event_capacity=config.limits.watch_buffer, store=store,
                         codec=BlobCodec(),   # payloads, outputs and checkpoints are Blobs, store or not
                         output_cache=config.outputs.cache_entries, config=core)

    def _credentials(self) -> grpc.ServerCredentials | None:
        tls = self.config.server.tls
        if tls is None:
            return None
        with open(tls.key, "rb") as f:
            key = f.read()
        with open(tls.cert, "rb") as f:
            cert = f.read()
        ca = None
        if tls.client_ca is not None:
            with open(tls.client_ca, "rb") as f:
                ca = f.read()
        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

    def _http_tls(self) -> ssl.SSLContext | None:
        tls = self.config.server.tls
        if tls is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(tls.cert, tls.key)
        if tls.client_ca is not None:
            context.load_verify_locations(tls.client_ca)
            context.verify_mode = ssl.CERT_OPTIONAL   # the probes need no certificate
        return context

    def _grpc_options(self, standby: bool) -> list[tuple[str, Any]]:
        limits = self.config.limits
        options: list[tuple[str, Any]] = [
            ("grpc.so_reuseport", 0),
            ("grpc.max_receive_message_length", limits.max_message_bytes),
            ("grpc.max_send_message_length", limits.max_message_bytes),
            ("grpc.keepalive_time_ms", int(limits.keepalive_interval_s * 1000)),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.http2.max_pings_without_data", 0),
        ]
        if standby:
            close_ms = int(self.config.server.standby_close_s * 1000)
            options += [("grpc.max_connection_age_ms", close_ms), ("grpc.max_connection_age_grace_ms", 1000)]
        return options

    async def _start_grpc(self, service: Service, auth: Authenticator, hub: WorkerHub, *, standby: bool) -> None:
        server = aio.server(options=self._grpc_options(standby))
        add_services(server, service, auth, hub)
        section = self.config.server
        port = self.grpc_port or section.grpc_port
        address = f"[{section.grpc_host}]:{port}" if ":" in section.grpc_host else f"{section.grpc_host}:{port}"
        credentials = self._credentials()
        for attempt in range(50):
            try:
                bound = (server.add_secure_port(address, credentials) if credentials is not None
                         else server.add_insecure_port(address))
            except RuntimeError:
                bound = 0
            if bound:
                break
            if not self.grpc_port:   # the first bind: the address is taken
                raise BindError(f"cannot listen on {address} (gRPC): address already in use or not available")
            await asyncio.sleep(0.02)   # our own previous server is letting go of the port
        else:
            raise BindError(f"cannot listen on {address} (gRPC) again after a leadership change")
        self.grpc_port = bound
        await server.start()
        self._grpc = server

    async def _stop_grpc(self, grace: float | None) -> None:
        server, self._grpc = self._grpc, None
        if server is not None:
            await server.stop(grace)

    def _watch_accept_errors(self, loop: asyncio.AbstractEventLoop) -> None:
        """asyncio reports every failed accept (out of file descriptors, most
        often) with a traceback; under a flood of connections that is
        thousands of lines a second. Count them and say so once an interval."""
        default = loop.get_exception_handler()

        def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            message = str(context.get("message", ""))
            if not message.startswith("socket.accept() out of system resource"):
                if default is not None:
                    default(loop, context)
                else:
                    loop.default_exception_handler(context)
                return
            self.counters.accept_errors += 1
            now = loop.time()
            if now - self._accept_logged < _ACCEPT_LOG_EVERY_S:
                self._accept_unlogged += 1
                return
            exc = context.get("exception")
            more = self._accept_unlogged
            self._accept_logged, self._accept_unlogged = now, 0
            log.error("cannot accept new connections: %s%s; lower limits.max_http_connections or raise the "
                      "open-file limit (ulimit -n)", exc if exc is not None else message,
                      f" ({more} more since the last such line)" if more else "",
                      extra={"action": "accept_failed"})

        loop.set_exception_handler(handle)

    # -- running

    def stop(self) -> None:
        """Begin a graceful stop (what SIGTERM does)."""
        if self.stopping is not None:
            self.stopping.set()

    async def run(self) -> int:
        """Serve until stopped; returns the exit status (0 after a graceful stop)."""
        config = self.config
        loop = asyncio.get_running_loop()
        self.stopping = asyncio.Event()
        if self.handle_signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(signum, self.stop)
                except (NotImplementedError, RuntimeError):   # not the main thread
                    pass
        tokens = check_environment(config, insecure_no_auth=self.insecure_no_auth,
                                   warn=lambda text: log.warning("%s", text))
        counters = self.counters
        self._watch_accept_errors(loop)
        auth = Authenticator(config, tokens, counters=counters)
        if not config.auth_enabled:
            log.warning("authentication is off: every caller is an admin%s",
                        " (--insecure-no-auth)" if self.insecure_no_auth else " (listening on loopback only)",
                        extra={"action": "auth_off"})
        limits = http_limits(config.limits)
        lease_ttls = {p.name: p.lease_ttl_s for p in config.pools}
        hub = WorkerHub(config.limits, lease_ttls, config.server.standby_close_s)
        service = Service(config, hub) if config.shard is None else ShardedService(config, hub, self.resource_shards)
        check_host = not config.auth_enabled and not self.insecure_no_auth
        section = config.server
        http = HttpListener(section.http_host, section.http_port,
                            Gateway(service, auth, check_host=check_host, counters=counters),
                            tls=self._http_tls(), limits=limits, counters=counters)
        metrics: HttpListener | None = None
        listeners = [http]
        if section.metrics_host is not None:
            metrics = HttpListener(section.metrics_host, section.metrics_port,
                                   Gateway(service, auth, check_host=check_host, metrics_listener=True,
                                           counters=counters), limits=limits, counters=counters)
            listeners.append(metrics)
        counters.open_connections = lambda: sum(len(listener.connections) for listener in listeners)
        _check_file_limit(config.limits.max_http_connections * len(listeners))
        try:
            self.http_port = await http.start()
        except OSError as exc:
            raise BindError(f"cannot listen on {section.http_addr} (HTTP): {exc.strerror or exc}") from None
        try:
            if metrics is not None:
                try:
                    self.metrics_port = await metrics.start()
                except OSError as exc:
                    raise BindError(f"cannot listen on {section.metrics_addr} (metrics): {exc.strerror or exc}"
                                    ) from None
            await self._start_grpc(service, auth, hub, standby=True)
            scheme = "https" if section.tls else "http"
            also = f", metrics http://{section.metrics_host}:{self.metrics_port}" if metrics is not None else ""
            log.info("listening: grpc %s:%d, http %s://%s:%d%s", section.grpc_host, self.grpc_port, scheme,
                     section.http_host, self.http_port, also,
                     extra={"action": "listening", "grpc_port": self.grpc_port, "http_port": self.http_port,
                            "metrics_port": self.metrics_port})
            while not self.stopping.is_set():
                await self._term(service, auth, hub)
            return self.exit_code
        finally:
            await self._stop_grpc(None)
            await http.stop()
            if isinstance(service, ShardedService):
                await service.peers.close()
            if metrics is not None:
                await metrics.stop()

    async def _term(self, service: Service, auth: Authenticator, hub: WorkerHub) -> None:
        """Wait to lead, then serve until stopped or deposed."""
        assert self.stopping is not None
        store = self._store()
        sched = self._scheduler(hub, store)
        hub.pools.clear()
        hub.graceful = False
        log.info("standing by: waiting to lead" if store is not None else "starting",
                 extra={"action": "standby"})
        starting = asyncio.get_running_loop().create_task(sched.start())
        stop_wait = asyncio.get_running_loop().create_task(self.stopping.wait())
        try:
            await asyncio.wait((starting, stop_wait), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
        if not starting.done():
            await sched.shutdown()   # gives up waiting to lead
            try:
                await starting
            except Exception:
                pass
            await self._close_store(store)
            return
        try:
            starting.result()
        except Exception as exc:
            log.error("could not start: %s", exc, extra={"action": "start_failed"})
            await self._close_store(store)
            self.exit_code = 1
            self.stopping.set()
            return
        self._record(sched)
        try:
            await service.add_configured(sched, self.config.recurring)
        except Exception as exc:
            log.error("a configured recurring schedule was refused: %s", exc, extra={"action": "start_failed"})
        await self._stop_grpc(None)
        await self._start_grpc(service, auth, hub, standby=False)
        service.lead(sched)
        scalers = await Scalers.start(sched, self.config.pools)
        self.serving.set()
        log.info("serving as the leader (epoch %d)", sched.epoch, extra={"action": "serving", "epoch": sched.epoch})
        stop_wait = asyncio.get_running_loop().create_task(self.stopping.wait())
        try:
            while sched.running and not self.stopping.is_set():
                await asyncio.wait((stop_wait,), timeout=0.2)
        finally:
            stop_wait.cancel()
        self.serving.clear()
        await scalers.close()
        if self.stopping.is_set() and sched.running:
            await self._drain(service, hub, sched)
            await self._close_store(store)
            return
        # Deposed: the scheduler stopped itself and told the workers (not_leader).
        log.warning("leadership lost (%s); standing by again", sched.lost_reason,
                    extra={"action": "leader_lost"})
        service.step_down()
        await self._let_streams_end(hub)
        await self._stop_grpc(0.5)
        await self._start_grpc(service, auth, hub, standby=True)
        await self._close_store(store)

    async def _drain(self, service: Service, hub: WorkerHub, sched: Scheduler) -> None:
        """SIGTERM: stop admitting, let running attempts finish (shutdown_grace_s),
        then tell the workers to go, and let their streams end."""
        grace = self.config.server.shutdown_grace_s
        log.info("stopping: running attempts have %g s to finish", grace, extra={"action": "stopping"})
        service.step_down("stopping")
        hub.graceful = True
        await sched.shutdown(grace)
        hub.shutdown_all("the server is shutting down", not_leader=False)
        await self._let_streams_end(hub)
        await self._stop_grpc(1.0)
        log.info("stopped", extra={"action": "stopped"})

    async def _let_streams_end(self, hub: WorkerHub) -> None:
        """Workers were told Shutdown: their streams end standby_close_s later, cleanly."""
        waiting = [conn.done for conn in hub.workers.values()]
        if waiting:
            await asyncio.wait(waiting, timeout=self.config.server.standby_close_s + 2.0)

    def _record(self, sched: Scheduler) -> None:
        """[trace]: record this term's workload (the recorder stops with the
        scheduler). A trace that cannot be written is logged, not fatal."""
        section = self.config.trace
        if section is None:
            return
        path = section.path.replace("{epoch}", str(sched.epoch or 0))
        try:
            from ..whatif import TraceRecorder

            TraceRecorder(sched, path, flush_interval=section.flush_interval_s,
                          sample_interval=section.sample_interval_s, max_buffer=section.max_buffer)
        except (OSError, ImportError) as exc:
            log.error("cannot record the trace to %s: %s", path, exc, extra={"action": "trace_error"})
            return
        log.info("recording the workload to %s", path, extra={"action": "trace", "path": path})

    @staticmethod
    async def _close_store(store: Any) -> None:
        if store is not None:
            try:
                await store.close()
            except Exception as exc:
                log.warning("closing the store: %s", exc)

