"""The processes of `serve` under its own HTTP server (http.server): a supervisor and N forked workers.

The supervisor binds the listening socket once and forks the workers, which inherit it; the kernel
hands each new connection to one worker's accept. Each worker runs uvloop, the app's lifespan
(startup before it accepts, shutdown after it stopped), and the connections it accepted.

The log process (LOG_OWN_PROCESS, on by default): the supervisor forks it first, without the socket;
it runs the receipts log's integrator and checkpointer at LOG_NICE, so their batches of Python work
(chains, leaf data, tiles: ~0.1 ms a receipt) never stall a worker's event loop; the workers only
keep the guard (a database behind the signer stops their writes). It is watched, replaced and
stopped like a worker.

Signals: SIGTERM or SIGINT to the supervisor closes its copy of the listening socket and passes
SIGTERM to every worker; a worker stops accepting (closes its copy, so the port refuses new
connections once all are closed), closes its idle connections, lets the requests in flight finish for
up to SHUTDOWN_TIMEOUT_SECONDS (their connections close after the answer), cuts the rest, runs the
lifespan shutdown, and exits 0. The supervisor waits for them (SIGKILL after the timeout and a grace
of LIFESPAN_GRACE_SECONDS) and returns.

Worker death: the supervisor notices a worker that exits on its own (polls each worker's pid every
WATCH_SECONDS, or at once on SIGCHLD), logs `worker_died`, marks its metrics dead, and forks a new one
in its place after RESPAWN_PAUSE_SECONDS. A worker whose lifespan startup fails exits with
STARTUP_FAILED: one of the first workers (serve's own start) makes the supervisor stop the others,
and `serve` exits 1, as a server that cannot start must; a replacement (the database was down when a
worker died, say) logs `worker_restart_failed` and is tried again, the pause doubling up to
RESPAWN_MAX_SECONDS, so the server comes back by itself once the database does (until round 18 the
first failed replacement stopped the whole server). The waits are the supervisor's loop's, never a
sleep: SIGTERM stops it at once. A worker whose supervisor died (its parent pid changes) shuts down
by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import socket
import sys
import time
from types import FrameType
from typing import Any

import structlog

from effect_ledger.db.receipt_log import log_runs_elsewhere, own_log_process
from effect_ledger.http.metrics import choose_value_class
from effect_ledger.settings import Settings

LOG_SLOT = -1  # the slot of the log process (LOG_OWN_PROCESS), beside the workers' 0 .. N-1
LOG_NICE = 5  # the log process yields the CPU to the workers when both want it
STARTUP_FAILED = 3  # a worker's exit code when its lifespan did not start
LIFESPAN_GRACE_SECONDS = 15  # beyond the shutdown timeout: the lifespan's shutdown (pools, tasks)
WATCH_SECONDS = 1.0
RESPAWN_PAUSE_SECONDS = 1.0  # between the death of a worker and its replacement
RESPAWN_MAX_SECONDS = 30.0  # the longest pause between replacements that keep failing to start
BACKLOG = 2048

log = structlog.get_logger("effect_ledger.http")


def listen(host: str, port: int) -> socket.socket:
    """The bound, listening socket the workers share."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.listen(BACKLOG)
    sock.setblocking(False)
    return sock


def serve(settings: Settings) -> int:
    """Run the supervisor until SIGTERM or SIGINT; the exit code for `serve`."""
    # The workers fork from this process, which imported prometheus_client before
    # prepare_multiprocess_dir set its directory: choose the per-process value files now.
    choose_value_class()
    try:
        sock = listen(settings.host, settings.port)
    except OSError as failed:
        print(
            f"effect-ledger serve: cannot listen on {settings.host}:{settings.port}: {failed}",
            file=sys.stderr,
        )
        return 1
    return Supervisor(sock, settings).run()


class Supervisor:
    """Forks the workers, replaces one that dies, stops them all on SIGTERM."""

    def __init__(self, sock: socket.socket, settings: Settings) -> None:
        self.sock = sock
        self.settings = settings
        self.workers: dict[int, int] = {}  # pid -> slot
        self.first: set[int] = set()  # the workers forked at serve's start (their failure is serve's)
        self.due: dict[int, float] = {}  # slot -> when (monotonic) its replacement is forked
        self.failed_starts: dict[int, int] = {}  # slot -> its replacements' failed starts in a row
        self.stop = False
        self.failed = False

    def run(self) -> int:
        wake_read, wake_write = os.pipe()
        os.set_blocking(wake_read, False)
        os.set_blocking(wake_write, False)
        previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD)}
        signal.set_wakeup_fd(wake_write)
        signal.signal(signal.SIGTERM, self._on_stop)
        signal.signal(signal.SIGINT, self._on_stop)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the select below
        try:
            if own_log_process(self.settings):
                log_runs_elsewhere()  # the workers forked below only watch the guard
                self._fork(LOG_SLOT)
            for slot in range(self.settings.workers):
                self._fork(slot)
            self.first = set(self.workers)
            while not self.stop:
                wait = min([WATCH_SECONDS, *(at - time.monotonic() for at in self.due.values())])
                with contextlib.suppress(InterruptedError):
                    select.select([wake_read], [], [], max(wait, 0.0))
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 512)
                self._reap()
                self._respawn()
            self._stop_workers()
        finally:
            signal.set_wakeup_fd(-1)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(wake_read)
            os.close(wake_write)
            self.sock.close()
        return 1 if self.failed else 0

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        self.stop = True

    def _fork(self, slot: int) -> None:
        pid = os.fork()
        if pid == 0:  # the worker: never returns into the supervisor's stack
            code = 1
            try:
                signal.set_wakeup_fd(-1)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
                    signal.signal(sig, signal.SIG_DFL)
                if slot == LOG_SLOT:
                    self.sock.close()
                    code = run_log_process(self.settings, os.getppid())
                else:
                    code = run_worker(self.sock, self.settings, os.getppid())
            except BaseException as exc:  # the worker's last resort: log, exit non-zero
                with contextlib.suppress(Exception):
                    log.error("worker_failed", exception_type=type(exc).__name__)
            finally:
                with contextlib.suppress(Exception):
                    sys.stdout.flush()
                    sys.stderr.flush()
                os._exit(code)
        self.workers[pid] = slot

    def _reap(self) -> None:
        for pid, slot in list(self.workers.items()):
            try:
                done, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done, status = pid, 0
            if done == 0:
                continue
            del self.workers[pid]
            _mark_dead(pid)
            code = os.waitstatus_to_exitcode(status)
            if self.stop:
                continue
            role = "log" if slot == LOG_SLOT else "http"
            if code == STARTUP_FAILED and pid in self.first:
                log.error("worker_start_failed", pid=pid, role=role)
                self.failed = self.stop = True
                continue
            if code == STARTUP_FAILED:
                tries = self.failed_starts[slot] = self.failed_starts.get(slot, 0) + 1
                pause = min(RESPAWN_MAX_SECONDS, RESPAWN_PAUSE_SECONDS * 2**tries)
                log.error("worker_restart_failed", pid=pid, role=role, failed_starts=tries, retry_in_s=pause)
            else:
                self.failed_starts.pop(slot, None)  # it had started: the next one starts afresh
                pause = RESPAWN_PAUSE_SECONDS
                log.error("worker_died", pid=pid, exit_code=code, role=role)
            self.due[slot] = time.monotonic() + pause

    def _respawn(self) -> None:
        now = time.monotonic()
        for slot, at in list(self.due.items()):
            if at <= now and not self.stop:
                del self.due[slot]
                self._fork(slot)

    def _stop_workers(self) -> None:
        self.sock.close()  # with the workers' copies closed too, new connections are refused
        for pid in self.workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_timeout_seconds + LIFESPAN_GRACE_SECONDS
        while self.workers and time.monotonic() < deadline:
            self._reap()
            time.sleep(0.05)
        for pid in list(self.workers):
            log.error("worker_killed", pid=pid, reason="shutdown timeout")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            _mark_dead(pid)
        self.workers.clear()


def _mark_dead(pid: int) -> None:
    """A dead worker's live gauges leave the multiprocess sums (its counters stay)."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        with contextlib.suppress(Exception):
            multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # Windows: asyncio's own loop
        loop = asyncio.new_event_loop()
    else:
        loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    return loop


def run_worker(sock: socket.socket, settings: Settings, parent: int) -> int:
    """One worker process: uvloop, the app's lifespan, the connections; its exit code."""
    loop = _new_loop()
    try:
        return loop.run_until_complete(_worker(sock, settings, parent))
    finally:
        loop.close()


def run_log_process(settings: Settings, parent: int) -> int:
    """The log process: the receipts log's integrator and checkpointer (db.receipt_log.background_log),
    at LOG_NICE, until SIGTERM; its exit code (STARTUP_FAILED when its first pass could not start)."""
    os.nice(LOG_NICE)
    loop = _new_loop()
    try:
        return loop.run_until_complete(_log_process(settings, parent))
    finally:
        loop.close()


async def _log_process(settings: Settings, parent: int) -> int:
    from effect_ledger.db.maintenance import in_background
    from effect_ledger.db.receipt_log import LogGuard, background_log
    from effect_ledger.http.metrics import Metrics

    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    metrics = Metrics()  # its refusals reach /metrics through the multiprocess directory
    try:
        async with contextlib.AsyncExitStack() as stack:
            try:
                await stack.enter_async_context(
                    background_log(settings, LogGuard(), metrics.log_refused, guard_only=False)
                )
            except Exception as exc:
                log.error("log_process_start_failed", exception_type=type(exc).__name__)
                return STARTUP_FAILED
            log.info("log_process_started", pid=os.getpid())
            await stack.enter_async_context(in_background(_watch_parent(parent, stopping)))
            await stopping.wait()
    finally:
        metrics.close()
    return 0


async def _watch_parent(parent: int, stopping: asyncio.Event) -> None:
    while True:
        await asyncio.sleep(1.0)
        if os.getppid() != parent:  # the supervisor is gone: nobody would stop this process
            log.error("supervisor_gone", pid=os.getpid())
            stopping.set()


async def _worker(sock: socket.socket, settings: Settings, parent: int) -> int:
    from effect_ledger.http.app import app_from_env
    from effect_ledger.http.lifespan import Lifespan
    from effect_ledger.http.server import Connection, Worker

    loop = asyncio.get_running_loop()
    app = app_from_env()
    state: dict[str, Any] = {}
    lifespan = Lifespan(app, state)
    if not await lifespan.startup():
        return STARTUP_FAILED
    worker = Worker(
        app,  # type: ignore[arg-type]  # Litestar's ASGI callable
        state,
        max_body_bytes=settings.max_body_bytes,
        keep_alive_seconds=settings.http_keep_alive_seconds,
        request_timeout_seconds=settings.http_request_timeout_seconds,
    )
    stopping = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    server = await loop.create_server(lambda: Connection(worker), sock=sock, backlog=BACKLOG)

    async def tick() -> None:
        while True:
            await asyncio.sleep(1.0)
            worker.on_tick()

    ticker = loop.create_task(tick())
    watcher = loop.create_task(_watch_parent(parent, stopping))
    try:
        await stopping.wait()
    finally:
        server.close()
        sock.close()
        worker.shutdown()
        if not await worker.drain(settings.shutdown_timeout_seconds):
            log.warning("shutdown_cut", requests=len(worker.tasks))
            worker.cut()
            await asyncio.sleep(0)
        ticker.cancel()
        watcher.cancel()
        await lifespan.shutdown()
    return 0


__all__ = ["LOG_SLOT", "STARTUP_FAILED", "Supervisor", "listen", "run_log_process", "run_worker", "serve"]
