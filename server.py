"""The relay: one Tornado process serving the relay, /api and the console.

    python server.py [--port 3000] [--data-dir ./data] [--mongo-url URL]

build_app() wires the parts; main() starts the store, the background
workers and the HTTP server, and stops them in order on SIGTERM/SIGINT.
"""
from __future__ import annotations

import asyncio
import errno
import gc
import importlib
import logging
import os
import re
import signal
import socket
import sys
import time

import tornado.web
from tornado.ioloop import PeriodicCallback
from tornado.log import access_log

import settings as settings_mod
from actions import ACTIONS, fail, own_command, reset_admin_password
from handlers import proxies
from handlers.api_rate import ApiRate
from handlers.relay_base import BodyFirstRouting
from models import passwords
from models.datadir import DataDirBusy, DataDirLock
from models.secrets import Vault, load_or_create_secret
from models.responses import ResponseStore
from models.seed import seed
from models.store import Store
from notify.bus import Bus
from relay.serving import loop as relay_loop, process, redact, watchdog
from relay.money.billing import Billing
from relay.catalog import Catalog
from relay.compat.memory import Compat
from relay.sessions import Sessions
from relay.scheduler import Scheduler
from relay.service import RelayService
from relay.stored_responses import StoredResponses
from relay.upstream.client import Upstream
from relay.money.backfill import backfill
from relay.money.retention import Retention
from relay.money.usage import UsageLog
from relay.serving.buglog import reason

log = logging.getLogger("relay")

# Each module ends with its own `default_handlers`.  Tornado tries rules in
# order: the relay's hot paths first, vendor-native paths (with ':' in them)
# before the generic OpenAI ones, the console's catch-alls last.
HANDLER_MODULES = [
    "handlers.relay_openai",
    "handlers.relay_responses",
    "handlers.relay_vendors",
    "handlers.relay_media",
    "handlers.relay_mj",
    "handlers.api_signin",
    "handlers.api_user",
    "handlers.api_user_admin",
    "handlers.api_token",
    "handlers.api_price",
    "handlers.api_channel",
    "handlers.api_admin",
    "handlers.api_log",
    "handlers.api_cache",
    "handlers.api_notify",
    "handlers.openapi",
    "handlers.console",
]
# After the grace period: the workers (flush, leases) get STOP_WORKERS, and
# the whole stop STOP_BOUND, past which relay/serving/watchdog.py ends it
# (workers 12 + connections 2 + database clients 3 + embedded servers 10,
# and a margin).
STOP_WORKERS = 12.0
STOP_BOUND = 32.0

# Modules with install(app): background workers that hook into start/stop.
INSTALLERS = ["models.migrations", "models.housekeeping", "notify.service",
              "relay.midjourney.wiring", "relay.money.limits"]


class RelayApplication(BodyFirstRouting, tornado.web.Application):
    draining = False

    def find_handler(self, request, **kwargs):
        if self.draining:
            # Shutting down: a request on a kept-alive connection is turned
            # away at once (and the connection closed), so the calls that are
            # running can finish within shutdown_grace.
            return self.get_handler_delegate(request, DrainingHandler)
        # Clients given a base URL with a trailing slash post to "//v1/...".
        if "//" in request.path:
            request.path = re.sub(r"/{2,}", "/", request.path)
        # The real client address and scheme, when a trusted proxy tells them.
        proxies.apply(request, self.settings["trusted_proxies"])
        return super().find_handler(request, **kwargs)


def log_request(handler) -> None:
    """Tornado's access-log line, with credential parameters of the URI
    masked (a Gemini client's ?key= was written whole on every 4xx/5xx)."""
    status = handler.get_status()
    log_method = access_log.info if status < 400 else (
        access_log.warning if status < 500 else access_log.error)
    request = handler.request
    log_method("%d %s %s (%s) %.2fms", status, request.method, redact.redact_uri(request.uri),
               request.remote_ip, 1000.0 * request.request_time())


class DrainingHandler(tornado.web.RequestHandler):
    def prepare(self) -> None:
        self.set_status(503)
        self.set_header("Connection", "close")
        self.set_header("Retry-After", "1")
        self.finish({"error": {"message": "The server is restarting; try again.",
                               "type": "service_unavailable", "code": "shutting_down"}})


def _handlers() -> list:
    routes = []
    for name in HANDLER_MODULES:
        routes += importlib.import_module(name).default_handlers
    return routes


def build_app(config, store: Store, bus: Bus) -> RelayApplication:
    """Wire every collaborator into the Application's settings."""
    secret = config.secret or load_or_create_secret(config.data_dir)
    vault = Vault(secret)
    catalog = Catalog(store, vault, ttl=config.cache_ttl, poll=config.invalidation_poll)
    billing = Billing(store, bus, process_id=catalog.process_id, lease_chunk=config.lease_chunk,
                      flush_interval=config.usage_flush_interval, data_dir=config.data_dir,
                      spill_max_mb=config.spill_max_mb, stale_after=config.lease_stale_after,
                      idle_release=config.lease_idle_release,
                      direct_below=config.lease_direct_below,
                      recall_wait=config.lease_recall_wait)
    usage_log = UsageLog(store, bus, billing=billing)
    retention = Retention(store, bus, usage_days=config.usage_retention_days,
                          rollup_days=config.rollup_retention_days,
                          max_bytes=int(config.storage_max_gb * 1e9))
    billing.after_flush.append(retention.tick)
    scheduler = Scheduler(catalog, store)
    upstream = Upstream(connect_timeout=config.connect_timeout,
                        first_byte_timeout=config.first_byte_timeout,
                        idle_timeout=config.stream_idle_timeout,
                        max_calls=config.max_upstream_clients,
                        max_streams=config.max_upstream_streams,
                        max_uploads=config.max_upstream_uploads,
                        queue_wait=config.upstream_queue_wait,
                        ca_file=config.upstream_ca_file, h2_streams=config.upstream_h2_streams,
                        connect_window=config.upstream_connect_window)
    service = RelayService(config, catalog, billing, usage_log, scheduler, upstream)
    service.compat = Compat(store, catalog, strip_ttl=config.compat_memory_days * 86400,
                            reprobe_after=config.wire_reprobe_hours * 3600)
    service.sessions = Sessions(store, scheduler, ttl=config.sticky_session_ttl)
    responses = StoredResponses(ResponseStore(store, config.responses_retention_days), catalog,
                                upstream)
    from handlers.fallback import NotFoundHandler
    try:
        trusted = proxies.networks(config.trusted_proxies)
    except ValueError as exc:
        raise SystemExit(f"trusted_proxies: {exc}") from None
    app = RelayApplication(
        _handlers(), default_handler_class=NotFoundHandler,
        cookie_secret=vault.cookie_secret, xsrf_cookies=False, log_function=log_request,
        config=config, store=store, bus=bus, vault=vault, catalog=catalog, billing=billing,
        usage_log=usage_log, retention=retention, scheduler=scheduler, upstream=upstream,
        service=service,
        responses=responses, compat=service.compat,
        started_at=time.time(), on_start=[], on_stop=[], trusted_proxies=trusted,
        api_rate=ApiRate(config.api_rate_limit))
    for name in INSTALLERS:
        importlib.import_module(name).install(app)
    return app


async def start_workers(app: RelayApplication, previous_process: str = "") -> None:
    s = app.settings
    await s["catalog"].load()
    await s["compat"].load()
    s["catalog"].start_polling()
    s["service"].sessions.start()
    # Before billing reclaims anything (relay/money/backfill.py says why).
    await backfill(s["store"])
    await s["billing"].start_up([previous_process] if previous_process else [])
    s["billing"].start()
    for starter in s.get("on_start", []):
        await starter(app)


async def stop_workers(app: RelayApplication, grace: float, budget: float = 8.0) -> None:
    """Let calls finish (up to `grace`), then stop the workers within `budget`
    seconds whatever the database does: what billing cannot write goes to
    the spill file."""
    s = app.settings
    deadline = time.monotonic() + grace
    while s["service"].inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if s["service"].inflight:
        # Cancelled, not left to run: billing is about to close its books,
        # and a call answered after that would be an answer without a charge.
        log.warning("%d call(s) still running after %.0fs; cancelling", s["service"].inflight, grace)
        s["service"].cancel_running()
        until = time.monotonic() + min(2.0, budget / 4)
        while s["service"].inflight and time.monotonic() < until:
            await asyncio.sleep(0.02)
    deadline = time.monotonic() + budget

    def left(share: float = 1.0) -> float:
        return max((deadline - time.monotonic()) * share, 0.1)
    for stopper in s.get("on_stop", []):
        try:
            await asyncio.wait_for(stopper(app), left(0.25))
        except (asyncio.TimeoutError, Exception) as exc:
            log.warning("stopping %s: %s", getattr(stopper, "__qualname__", stopper),
                        reason(exc))
    try:
        await asyncio.wait_for(s["service"].sessions.stop(), left(0.1))
    except (asyncio.TimeoutError, Exception):
        pass
    try:
        await asyncio.wait_for(s["compat"].drain(), left(0.1))
    except (asyncio.TimeoutError, Exception):
        pass
    try:
        await asyncio.wait_for(s["catalog"].stop_polling(), left(0.25))
    except (asyncio.TimeoutError, Exception):
        pass
    await s["billing"].stop(timeout=left())
    s["upstream"].close()
    try:
        await asyncio.wait_for(passwords.estimator.close(), 2)
    except (asyncio.TimeoutError, OSError):
        pass


def bind_only(port: int, host: str) -> list[socket.socket]:
    """Take the port now, listen later: a client that connects before the
    relay is ready is refused, not left waiting on a half-started process."""
    sockets = []
    try:
        for af, kind, proto, _, addr in sorted(set(socket.getaddrinfo(
                host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE))):
            sock = socket.socket(af, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if af == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.setblocking(False)
            sock.bind(addr[:2] if af == socket.AF_INET else addr)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def claim(config) -> tuple[DataDirLock, list]:
    """The data directory, then the port: refuse in one line if either is
    taken, before anything is started or changed."""
    lock = DataDirLock(config.data_dir)
    try:
        lock.acquire()
    except DataDirBusy as exc:
        fail(str(exc))
    try:
        sockets = bind_only(config.port, config.host)
    except OSError as exc:
        lock.release()
        if exc.errno == errno.EADDRINUSE:
            fail(f"port {config.port} on {config.host or '*'} is already in use")
        fail(f"cannot listen on {config.host or '*'}:{config.port}: {exc.strerror or exc}")
    return lock, sockets


async def serve(config, lock: DataDirLock, sockets: list) -> None:
    relay_loop.install()
    logging.basicConfig(level=config.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.log_level.lower() != "debug":
        # One line per request costs more than the relay itself at load;
        # failures are still logged (4xx/5xx are warnings and errors).
        logging.getLogger("tornado.access").setLevel(logging.WARNING)
    store = Store(config.mongo_url, config.data_dir, config.db_name,
                  report_timeout=config.report_timeout)
    await store.start()
    generated = await seed(store, config.admin_password)
    if generated:
        # Printed once, to the console only, never to the log.
        print(f"\n  First start: administrator 'root' created with password: {generated}\n"
              "  It will not be shown again; you will choose a new one at the first sign-in.\n"
              f"  Lost it? {own_command()} --reset-admin-password\n", flush=True)
    bus = Bus()
    app = build_app(config, store, bus)
    previous = lock.previous.get("process_id", "")
    # Until the predecessor is reclaimed, the lock keeps naming it.
    lock.write(port=config.port, process_id=previous)
    await start_workers(app, previous)
    lock.write(port=config.port, process_id=app.settings["billing"].pid,
               database=store.embedded.url if store.embedded else "", db_name=config.db_name)
    files = process.raise_open_file_limit()
    process.tune_gc()
    process.allocator.start()
    full_gc = PeriodicCallback(gc.collect, 300_000)  # what cycles rare paths leave
    full_gc.start()
    server = process.RelayHTTPServer(app, xheaders=False, max_body_size=8 * 1024 * 1024,
                                     idle_connection_timeout=300,
                                     chunk_size=process.READ_CHUNK)
    # A burst of new streams must not overflow the accept queue (the kernel
    # caps this at net.core.somaxconn).
    for sock in sockets:
        sock.listen(4096)
    server.add_sockets(sockets)
    log.info("open-file limit %s", files)
    log.info("relay listening on %s:%s (database: %s)", config.host, config.port,
             "embedded" if not config.mongo_url else "external")
    print(f"relay listening on http://{config.host}:{config.port}", flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down: no new connections; draining calls")
    watchdog.arm(config.shutdown_grace + STOP_BOUND)
    server.stop()
    full_gc.stop()
    app.draining = True
    try:
        # Calls get shutdown_grace; flushing, leases and the database get
        # a bounded few seconds more, whatever state the database is in.
        await asyncio.wait_for(stop_workers(app, config.shutdown_grace),
                               config.shutdown_grace + STOP_WORKERS)
    except asyncio.TimeoutError:
        app.settings["billing"].journal.drain_all()
        log.error("shutdown did not finish in time; unwritten usage is in the spill file")
    try:
        await asyncio.wait_for(server.close_all_connections(), 2)
    except asyncio.TimeoutError:
        pass
    await store.close()
    lock.release()
    log.info("stopped")


def main(argv=None) -> None:
    config, actions = settings_mod.parse(sys.argv[1:] if argv is None else argv, actions=ACTIONS)
    if actions["reset_admin_password"]:
        reset_admin_password(config)
        return
    lock, sockets = claim(config)
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    loop.run_until_complete(serve(config, lock, sockets))
    # Not asyncio.run(): its teardown cancels every task still there and
    # waits for each without a bound, and a database driver's task cut off
    # by the stop can wait on a lock of its own for ever (seen: pymongo's
    # _asyncio_lock after the database died).  Nothing is left to write: the
    # books are closed or in the spill file, the lock is released, the log
    # says "stopped".
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
