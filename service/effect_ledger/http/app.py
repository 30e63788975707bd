"""The composition root: builds the Litestar app with its pools, verifier, routes and error mapping."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import structlog
from litestar import Litestar
from litestar.openapi import OpenAPIConfig

from effect_ledger import __version__, tracing
from effect_ledger.db.ledger import Ledger
from effect_ledger.db.maintenance import background_maintenance, in_background, watch_backlog
from effect_ledger.db.migrate import head_revision
from effect_ledger.db.pools import open_when_reachable
from effect_ledger.db.receipt_log import LogGuard, background_log, witness_config
from effect_ledger.domain.approvals import parse_policy
from effect_ledger.http.approvals import ApprovalsController
from effect_ledger.http.audit import AuditController
from effect_ledger.http.auth import TokenVerifier
from effect_ledger.http.console import (
    CONSOLE_ROUTES,
    ConsoleHeaders,
    Sealer,
    console_aware,
    session_key,
    template_config,
)
from effect_ledger.http.diagnostics import DiagnosticsController
from effect_ledger.http.docs import docs_assets, docs_plugin
from effect_ledger.http.executor import ExecutorController
from effect_ledger.http.fastpath import ExecutorFastPath
from effect_ledger.http.health import livez, readyz
from effect_ledger.http.incidents import incident_spool
from effect_ledger.http.journal import JournalController
from effect_ledger.http.journal_continuations import load_key_ring
from effect_ledger.http.journal_telemetry import JournalMetrics
from effect_ledger.http.metrics import Metrics, metrics_endpoint
from effect_ledger.http.openapi import document_problems
from effect_ledger.http.pacing import Pacer
from effect_ledger.http.problems import EXCEPTION_HANDLERS
from effect_ledger.http.ratelimit import RateLimiter
from effect_ledger.http.receipt_log import LogController
from effect_ledger.http.reconciler import ReconcilerController
from effect_ledger.http.recovery import RecoveryController
from effect_ledger.http.telemetry import LedgerTelemetry, RequestTelemetry
from effect_ledger.logs import configure_logging
from effect_ledger.settings import Settings
from effect_ledger.signer import signer_from_settings

ROUTES: list[Any] = [
    ExecutorController,
    livez,
    readyz,
    RecoveryController,
    DiagnosticsController,
    ReconcilerController,
    AuditController,
    LogController,
    JournalController,
    ApprovalsController,
    metrics_endpoint,
    *CONSOLE_ROUTES,
]


def _startup_retry(failure: BaseException, delay: float) -> None:
    """One log line per retry of a database not reachable (or not writable) at start-up: the failure's
    kind only, never its text (it may carry a host or a user name)."""
    structlog.get_logger("effect_ledger").warning(
        "database not reachable at start-up, retrying",
        error=type(failure).__name__,
        retry_in_s=round(delay, 2),
    )


@asynccontextmanager
async def settled_heap(_: Litestar) -> AsyncIterator[None]:
    """After start-up, once per process: every object alive then (modules, the app, its routes and
    pools) moves to the cyclic collector's permanent generation, so its full passes stop walking them.
    Before, a full pass over a worker's start-up heap ran on some request's path every few thousand
    requests: a pause of tens of milliseconds (docs/performance.md, round 4)."""
    global _HEAP_SETTLED
    if not _HEAP_SETTLED:
        _HEAP_SETTLED = True
        gc.collect()
        gc.freeze()
    yield


_HEAP_SETTLED = False


def create_app(settings: Settings, *, jwt_secret: str | None = None) -> Litestar:
    """Build the app for `settings`; pools open at start-up and close at shutdown."""
    configure_logging(settings.log_level, settings.log_format)
    verifier = TokenVerifier(settings, jwt_secret)
    metrics = Metrics()
    log_guard = LogGuard()
    tracing.configure_from_env()  # off unless the OTEL_* variables ask for traces

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        pools = await open_when_reachable(settings, _startup_retry)
        app.state.pools = pools
        observer = LedgerTelemetry(metrics)
        app.state.ledger = Ledger(pools.runtime, pools.acquire_timeout, observer)
        app.state.audit_ledger = Ledger(pools.audit or pools.runtime, pools.acquire_timeout, observer)
        # published from start-up on
        metrics.watch_pools(pools.admissions, runtime=pools.runtime, audit=pools.audit, reader=pools.reader)
        limiter = RateLimiter.from_settings(settings, metrics.rate_limit_overflow.inc)
        app.state.limiter = limiter
        try:
            async with in_background(metrics.pools_loop()):
                yield
        finally:
            limiter.close()
            await pools.close()
            metrics.close()

    app = Litestar(
        route_handlers=[*ROUTES, docs_assets()],
        exception_handlers=console_aware(EXCEPTION_HANDLERS),  # console paths answer with pages
        template_config=template_config(),
        # the spool needs the pools: after `lifespan`; sweep and purge use their own owner connection
        lifespan=[
            lifespan,
            incident_spool,
            lambda _: background_maintenance(settings, metrics),
            lambda _: background_log(settings, log_guard, metrics.log_refused),
            lambda _: watch_backlog(settings, metrics.observe_backlog),
            settled_heap,
        ],
        request_max_body_size=settings.max_body_bytes,
        openapi_config=OpenAPIConfig(
            title="effect-ledger",
            version=__version__,
            description="Claims, fenced transitions, receipts and reconciliation for side effects.",
            path="/schema",
            render_plugins=[docs_plugin()],
        ),
        debug=False,
        logging_config=None,  # logs.configure_logging owns logging: JSON, redacted
    )
    # Outermost: request IDs, summary lines and latencies cover 404s and problem answers too. Then the
    # executor calls, served before routing (http.fastpath); the console's headers wrap only its paths.
    routed = ConsoleHeaders(app.asgi_handler)
    app.asgi_handler = RequestTelemetry(ExecutorFastPath(routed, settings.max_body_bytes), metrics)
    document_problems(app)
    app.state.metrics = metrics
    app.state.journal_metrics = JournalMetrics(metrics.registry)
    app.state.verifier = verifier
    app.state.pacer = Pacer(
        settings.rate_limit_pace_ms / 1000,
        settings.rate_limit_pace_max_held,
        on_held=metrics.rate_limit_paced.inc,
    )
    shared_secret = (jwt_secret or settings.jwt_secret) if settings.jwt_algorithm == "HS256" else None
    app.state.console_sealer = Sealer(session_key(settings.console_session_key, shared_secret))
    app.state.migration_head = head_revision()
    app.state.settings = settings
    app.state.log_guard = log_guard
    app.state.log_signer = signer_from_settings(settings) if settings.log_enabled else None
    app.state.log_witnesses = witness_config(settings)  # parsed once (Settings checked it)

    app.state.approval_policy = parse_policy(settings.approval_policy)
    app.state.journal_state_keys = load_key_ring(settings)
    return app


def app_from_env() -> Litestar:
    """Factory for multi-worker servers: each worker reads the settings its parent put in the environment."""
    return create_app(Settings.from_env())
