"""Prometheus metrics at /metrics: ledger decisions, request latency, database pools.

Labels are bounded by the code (results, statuses, codes, route templates), never by callers:
no tenant, principal or operation ID appears in any series.

Several server processes (`serve --workers N`) share their counts through prometheus_client's
multiprocess mode: with PROMETHEUS_MULTIPROC_DIR set, each process writes its values to files
there and a scrape of any process sums them. `serve` sets it up (see `prepare_multiprocess_dir`).
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import asyncpg
import structlog
from litestar import Request, Response, get
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from effect_ledger import __version__
from effect_ledger.domain.errors import PROBLEMS
from effect_ledger.domain.model import TERMINAL, UNKNOWN, EventDraft

log = structlog.get_logger("effect_ledger.metrics")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

# claim verdicts (db.ledger) and claim refusals (problem codes) -> the `result` label
CLAIM_RESULTS = {
    "created": "granted",
    "new_attempt": "reclaimed",
    "replay": "replayed",
    "reuse_receipt": "reuse_receipt",
    "operation_in_progress": "in_progress",
    "outcome_unknown": "outcome_unknown",
    "intent_conflict": "intent_conflict",
    "approval_required": "approval_required",
    "approval_denied": "approval_denied",
}
APPROVAL_EVENTS = ("requested", "approved", "denied", "revoked", "expired", "consumed")
# Retry amplification: a claim that starts an operation is its first attempt; every other claim of a
# known ID is a re-attempt (a reclaim after an expired lease or not_applied, a replayed claim whose
# answer was lost, a claim bounced by a live lease, a repeat answered by the receipt or outcome_unknown).
ATTEMPT_KINDS = {
    "granted": "first",
    "reclaimed": "retry",
    "replayed": "retry",
    "in_progress": "retry",
    "outcome_unknown": "retry",
    "reuse_receipt": "retry",
}
SHED_REASONS = ("queue", "wait")
POOLS = ("runtime", "audit", "reader")
# Every status change the state machine allows; exported from the start so rates never lack a series.
TRANSITIONS = (
    ("none", "pending"),
    ("pending", "submitted"),
    ("pending", "committed"),
    ("pending", "not_applied"),
    ("submitted", "committed"),
    ("submitted", "not_applied"),
    ("submitted", "unknown"),
    ("unknown", "committed"),
    ("unknown", "not_applied"),
    ("not_applied", "pending"),
)
RECONCILIATIONS = ("committed", "not_applied", "unresolved", "conflicting")
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Claims and transitions take a few milliseconds; lock waits and timeouts take up to seconds.
POOL_PUBLISH_SECONDS = 0.1  # multi-process: how often a worker publishes its pools' gauges
_SERIES_REMEMBERED = 1024
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _event_shape(event: EventDraft) -> tuple[str, str | None, str | None, bool]:
    """What decides the series an event increments (Metrics._event_series): bounded values only."""
    kind = event.kind
    conflicting = kind == "discrepancy" and event.data.get("source") == "resolve"
    return kind, event.from_status, event.to_status, conflicting


def multiprocess_dir() -> str | None:
    """The shared metrics directory of a multi-process server, if there is one."""
    return os.environ.get(MULTIPROC_ENV) or None


# This process's ID, read once and again in every child a fork makes: prometheus_client's multiprocess
# values ask for the process identifier on every increment (to notice a fork), and os.getpid() there
# was a system call four or five times a request (~3 % of a worker's samples under load, py-spy,
# round 15). The fork hook keeps the one rule the identifier must follow: distinct in live processes.
_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def _process_id() -> int:
    return _PID[0]


def choose_value_class() -> None:
    """Before the server's processes fork: the value class for PROMETHEUS_MULTIPROC_DIR as it is now
    (this process imported prometheus_client before prepare_multiprocess_dir set it): per-process
    value files, keyed by the fork-refreshed process ID and written straight through (written_through);
    plain values without the directory."""
    from prometheus_client import values

    if multiprocess_dir() is None:
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    else:
        values.ValueClass = written_through(values.MultiProcessValue(process_identifier=_process_id))  # type: ignore[no-untyped-call]


def written_through(mmaped: Any) -> Any:
    """prometheus_client's per-process file value (`mmaped`), a change written to the mapped file at
    once but without the class's lock and fork check on every change: 0.24 against 0.57 µs an
    increment, four or five a request (with the receipts log in a process of its own, serve runs in
    multiprocess mode even with one worker, and the worker paid them on every request: round 30). The
    event loop's thread is the only one that changes a value; a fork is handled when it happens
    (_after_fork), not looked for on every change. Every scrape sees every process's values as they are
    (round 30 first wrote them every 0.1 s instead, 0.09 µs an increment, and a scrape saw the other
    workers up to 0.1 s late: the exact sum was worth the difference)."""

    class WrittenThrough(mmaped):  # type: ignore[misc]
        first: Any = None  # a value of this class, for _after_fork

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            if WrittenThrough.first is None:
                WrittenThrough.first = self

        def inc(self, amount: float) -> None:
            self._value += amount
            self._timestamp = 0.0
            self._file.write_value(self._key, self._value, 0.0)

        def set(self, value: float, timestamp: float | None = None) -> None:
            self._value = value
            self._timestamp = timestamp or 0.0
            self._file.write_value(self._key, value, self._timestamp)

    _CLASSES.append((WrittenThrough, mmaped))
    return WrittenThrough


_CLASSES: list[tuple[Any, Any]] = []  # (written_through's class, the file value class it extends)


def _after_fork() -> None:
    """In a forked child, at once: every value reloaded from the child's own (new) files by the file
    value class's own fork check (its `get` runs it; the process ID is the child's: _PID's hook ran
    first). written_through's changes skip that check, so without this a child would write into its
    parent's files."""
    for cls, mmaped in _CLASSES:
        if cls.first is not None:
            mmaped.get(cls.first)


os.register_at_fork(after_in_child=_after_fork)  # after _PID's (hooks in a child run in registration order)


def prepare_multiprocess_dir(processes: int) -> Path | None:
    """Before server processes start: empty the configured directory, or create one for N > 1 processes
    (the workers and the log process).

    Returns the directory this call created (the caller removes it on exit), else None.
    """
    configured = multiprocess_dir()
    if configured:
        path = Path(configured)
        path.mkdir(parents=True, exist_ok=True)
        for stale in path.glob("*.db"):  # values of an earlier run would be added to this one's
            stale.unlink()
        return None
    if processes <= 1:
        return None
    created = Path(tempfile.mkdtemp(prefix="effect-ledger-metrics-"))
    os.environ[MULTIPROC_ENV] = str(created)
    return created


class Metrics:
    """The service's metrics in their own registry (one per app, so tests start from zero)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.claims = Counter("effect_ledger_claims", "Claims answered, by result.", ["result"], registry=r)
        self.log_refusals = Counter(
            "effect_ledger_log_refusals",
            "Checkpoints of the receipts log not signed, by reason (a rewrite of logged history, a log"
            " behind the signer, the signer's refusal).",
            ["reason"],
            registry=r,
        )
        self.approvals = Counter(
            "effect_ledger_approvals", "Approval events committed, by kind.", ["event"], registry=r
        )
        self.transitions = Counter(
            "effect_ledger_transitions",
            "Status changes recorded, by from and to status.",
            ["from_status", "to_status"],
            registry=r,
        )
        self.unknown_recorded = Counter(
            "effect_ledger_unknown_outcomes_recorded",
            "Operations that became unknown: reported by the executor, or a submitted lease that expired.",
            ["cause"],
            registry=r,
        )
        self.unknown_resolved = Counter(
            "effect_ledger_unknown_outcomes_resolved",
            "Unknown operations settled (by a reconciler or a late executor report), by outcome.",
            ["outcome"],
            registry=r,
        )
        self.reconciliations = Counter(
            "effect_ledger_reconciliations",
            "Reconciler verdicts recorded, by outcome.",
            ["outcome"],
            registry=r,
        )
        self.lease_expiries = Counter(
            "effect_ledger_lease_expiries",
            "Submitted leases materialised as expired (unknown), by the sweeper or by a later transition.",
            ["via"],
            registry=r,
        )
        self.refusals = Counter(
            "effect_ledger_refusals",
            "Transitions refused (stale_claim, invalid_transition...), by call and problem code.",
            ["call", "code"],
            registry=r,
        )
        self.claim_attempts = Counter(
            "effect_ledger_claim_attempts",
            "Claims by attempt (first: a new operation; retry: any other claim of a known ID) and result.",
            ["attempt", "result"],
            registry=r,
        )
        self.rate_limited = Counter(
            "effect_ledger_rate_limited",
            "Requests refused with 429 rate_limited, by route template.",
            ["route"],
            registry=r,
        )
        self.rate_limit_overflow = Counter(
            "effect_ledger_rate_limit_overflow",
            "Requests admitted unchecked because the shared bucket table had no free slot.",
            registry=r,
        )
        self.rate_limit_paced = Counter(
            "effect_ledger_rate_limit_paced",
            "429s held before they were sent, because their caller kept sending while refused.",
            registry=r,
        )
        self.shed = Counter(
            "effect_ledger_db_pool_shed",
            "Requests refused with 503 before queueing for a connection, by pool and reason (queue, wait).",
            ["pool", "reason"],
            registry=r,
        )
        self.pool_waiting = Gauge(
            "effect_ledger_db_pool_waiting",
            "Requests queued for a connection, by pool.",
            ["pool"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.unknown_waiting = Gauge(
            "effect_ledger_unknown_outcomes_waiting",
            "Unknown outcomes (expired submitted included) waiting for reconciliation, all tenants.",
            registry=r,
            multiprocess_mode="max",
        )
        self.unknown_oldest = Gauge(
            "effect_ledger_unknown_outcome_oldest_age_seconds",
            "How long the oldest unknown outcome has waited for reconciliation.",
            registry=r,
            multiprocess_mode="max",
        )
        self.purge_overdue = Gauge(
            "effect_ledger_purge_overdue_seconds",
            "How far past its retention the oldest purgeable operation is (0: purge keeps up).",
            registry=r,
            multiprocess_mode="max",
        )
        self.requests = Histogram(
            "effect_ledger_http_request_duration_seconds",
            "HTTP requests, by route template, method and status class.",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.pool_connections = Gauge(
            "effect_ledger_db_pool_connections",
            "Database pool connections, by pool and state.",
            ["pool", "state"],
            registry=r,
            multiprocess_mode="livesum",
        )
        self.pool_max = Gauge(
            "effect_ledger_db_pool_max_connections",
            "Database pool capacity, by pool.",
            ["pool"],
            registry=r,
            multiprocess_mode="livesum",
        )
        build = Gauge(
            "effect_ledger_build_info",
            "The running version.",
            ["version"],
            registry=r,
            multiprocess_mode="max",
        )
        build.labels(__version__).set(1)
        for result in CLAIM_RESULTS.values():
            self.claims.labels(result)
        for kind in APPROVAL_EVENTS:
            self.approvals.labels(kind)
        for source, target in TRANSITIONS:
            self.transitions.labels(source, target)
        for cause in ("reported", "lease_expired"):
            self.unknown_recorded.labels(cause)
        for outcome in sorted(TERMINAL):
            self.unknown_resolved.labels(outcome)
        for outcome in RECONCILIATIONS:
            self.reconciliations.labels(outcome)
        for via in ("sweep", "transition"):
            self.lease_expiries.labels(via)
        for result, attempt in ATTEMPT_KINDS.items():
            self.claim_attempts.labels(attempt, result)
        for pool in POOLS:
            for reason in SHED_REASONS:
                self.shed.labels(pool, reason)
        self._admissions: dict[str, Any] = {}
        self._pools: dict[str, asyncpg.Pool] = {}
        self._multiprocess = multiprocess_dir() is not None
        self._request_series: dict[tuple[str, str, int], Any] = {}
        self._decisions: dict[tuple[Any, ...], tuple[Any, ...]] = {}  # Metrics.observe's series
        self._limited_series: dict[str, Any] = {}

    # --- the ledger observer (db.ledger.LedgerObserver) -------------------------------------

    def observe(self, call: str, outcome: str, events: Sequence[EventDraft]) -> None:
        """Count one ledger decision and the events it committed. The series one kind of decision
        increments (its call, outcome and events' kinds and statuses) are looked up once per worker:
        prometheus_client's labels() costs more than the increment."""
        key = (call, outcome, *map(_event_shape, events))
        increments = self._decisions.get(key)
        if increments is None:
            series = self._decision_series(call, outcome, events)
            increments = tuple(_increment_of(counter) for counter in series)
            if len(self._decisions) < _SERIES_REMEMBERED:  # calls, outcomes and event shapes are bounded
                self._decisions[key] = increments
        for increment in increments:
            increment(1)

    def _decision_series(self, call: str, outcome: str, events: Sequence[EventDraft]) -> tuple[Any, ...]:
        """The series `observe` increments for one decision, in order."""
        series: list[Any] = []
        if call == "claim":
            result = CLAIM_RESULTS.get(outcome)
            if result is not None:
                series.append(self.claims.labels(result))
                if result in ATTEMPT_KINDS:
                    series.append(self.claim_attempts.labels(ATTEMPT_KINDS[result], result))
        elif outcome in PROBLEMS:
            series.append(self.refusals.labels(call, outcome))
        for event in events:
            series.extend(self._event_series(call, event))
        return tuple(series)

    def approval_event(self, kind: str) -> None:
        """Count one committed approval event (db.approvals.ApprovalObserver)."""
        self.approvals.labels(kind).inc()

    def _event_series(self, call: str, event: EventDraft) -> list[Any]:
        """The series one committed event increments (everything `_event_shape` names decides them)."""
        series: list[Any] = []
        source, target = event.from_status, event.to_status
        if target is not None and source != target:
            series.append(self.transitions.labels(source or "none", target))
        if target == UNKNOWN and source != UNKNOWN:
            cause = "lease_expired" if event.kind == "lease_expired" else "reported"
            series.append(self.unknown_recorded.labels(cause))
        if source == UNKNOWN and target in TERMINAL:
            series.append(self.unknown_resolved.labels(target))
        if event.kind == "lease_expired":
            series.append(self.lease_expiries.labels("sweep" if call == "sweep" else "transition"))
        if event.kind == "resolved" and target is not None:
            series.append(self.reconciliations.labels(target))
        elif event.kind == "reconcile_unresolved":
            series.append(self.reconciliations.labels("unresolved"))
        elif event.kind == "discrepancy" and event.data.get("source") == "resolve":
            series.append(self.reconciliations.labels("conflicting"))
        return series

    # --- requests and pools -----------------------------------------------------------------

    def observe_request(self, route: str, method: str, status: int, seconds: float) -> None:
        """Count one answered request in the latency histogram (its series looked up once per worker)."""
        key = (route, method, status // 100)
        series = self._request_series.get(key)
        if series is None:
            shown = method if method in METHODS else "other"
            series = _Observation(self.requests.labels(route, shown, f"{status // 100}xx"))
            if len(self._request_series) < _SERIES_REMEMBERED:  # routes and methods are bounded; be sure
                self._request_series[key] = series
        series.observe(seconds)
        if status == 429:
            limited = self._limited_series.get(route)
            if limited is None:
                limited = self.rate_limited.labels(route)
                if len(self._limited_series) < _SERIES_REMEMBERED:
                    self._limited_series[route] = limited
            limited.inc()

    def watch_pools(self, admissions: Mapping[str, Any] | None = None, **pools: asyncpg.Pool | None) -> None:
        """The pools whose connections (and queues, with `admissions`) the gauges report."""
        self._pools = {name: pool for name, pool in pools.items() if pool is not None}
        self._admissions = dict(admissions or {})
        for admission in self._admissions.values():
            admission.on_shed = self.count_shed
        self.refresh_pools()

    def log_refused(self, reason: str, tenant: str) -> None:
        """A checkpoint the receipts log did not sign (the tenant goes to the log line, not a label)."""
        self.log_refusals.labels(reason=reason).inc()

    def observe_backlog(self, backlog: Any) -> None:
        """The backlog read by db.maintenance.watch_backlog."""
        self.unknown_waiting.set(backlog.unknown_waiting)
        self.unknown_oldest.set(backlog.unknown_oldest_seconds)
        self.purge_overdue.set(backlog.purge_overdue_seconds)

    def count_shed(self, pool: str, reason: str) -> None:
        """One request shed before queueing for `pool`'s connections."""
        self.shed.labels(pool, reason).inc()

    def refresh_pools(self) -> None:
        """Read the pools' sizes into the gauges."""
        for name, pool in self._pools.items():
            size, idle = pool.get_size(), pool.get_idle_size()
            self.pool_connections.labels(name, "in_use").set(size - idle)
            self.pool_connections.labels(name, "idle").set(idle)
            self.pool_max.labels(name).set(pool.get_max_size())
        for name, admission in self._admissions.items():
            self.pool_waiting.labels(name).set(admission.queued)

    async def pools_loop(self) -> None:
        """In a worker of a multiprocess server: its pools' gauges published every POOL_PUBLISH_SECONDS,
        whether requests come or not (until round 30 from the request path, a clock read a request); a
        scrape reaches one worker, which refreshes its own on rendering. Returns at once otherwise."""
        if not self._multiprocess:
            return
        while True:
            await asyncio.sleep(POOL_PUBLISH_SECONDS)
            try:
                self.refresh_pools()
            except Exception as exc:  # a pool closing at shutdown: the next pass tries again
                log.warning("metrics_pools_failed", exception_type=type(exc).__name__)

    def render(self) -> bytes:
        """The text exposition: this process's registry, or every process's values in multiprocess mode."""
        self.refresh_pools()
        if self._multiprocess:
            merged = CollectorRegistry()
            multiprocess.MultiProcessCollector(merged)  # type: ignore[no-untyped-call]
            return bytes(generate_latest(merged))
        return bytes(generate_latest(self.registry))

    def close(self) -> None:
        """At process shutdown: this process's live gauges stop counting towards the sums."""
        if self._multiprocess:
            multiprocess.mark_process_dead(os.getpid())  # type: ignore[no-untyped-call]


# prometheus_client's content type without its charset: Litestar appends `; charset=utf-8` to every
# text/ media type, and until round 36 the header carried the parameter twice, which a Go parser
# (mime.ParseMediaType, as Prometheus's scrape reads it) refuses as a duplicate parameter.
EXPOSITION_TYPE = "; ".join(p for p in CONTENT_TYPE_LATEST.split("; ") if not p.startswith("charset="))


@get("/metrics", tags=["operations"], media_type=EXPOSITION_TYPE)
async def metrics_endpoint(request: Request[Any, Any, Any]) -> Response[bytes]:
    """Prometheus text exposition; no token needed, no tenant data."""
    metrics: Metrics = request.app.state.metrics
    return Response(metrics.render(), media_type=EXPOSITION_TYPE)


def _increment_of(counter: Any) -> Any:
    """A counter series' increment, one call: its value's own `inc` (what Counter.inc does after its
    checks, which a series looked up by labels() always passes), else the counter's public `inc`."""
    value = getattr(counter, "_value", None)
    inc = getattr(value, "inc", None)
    return inc if callable(inc) else counter.inc


class _Observation:
    """One histogram series' `observe`, as Histogram.observe does it (the sum, then the first bucket
    whose bound is >= the amount) with the bucket found by bisection and no checks a labelled series
    always passes; the public `observe` when the series is not laid out as expected."""

    __slots__ = ("_bounds", "_buckets", "_series", "_sum")

    def __init__(self, series: Any) -> None:
        self._series = series
        bounds: Any = getattr(series, "_upper_bounds", None)
        buckets: Any = getattr(series, "_buckets", None)
        total: Any = getattr(series, "_sum", None)
        laid_out = None not in (bounds, buckets, total) and len(bounds) == len(buckets)
        self._bounds = list(bounds) if laid_out else None
        self._buckets = [bucket.inc for bucket in buckets] if laid_out else []
        self._sum = total.inc if laid_out else None

    def observe(self, amount: float) -> None:
        if self._sum is None or self._bounds is None:
            self._series.observe(amount)
            return
        self._sum(amount)
        index = bisect_left(self._bounds, amount)  # the first bound >= amount (the last is +Inf)
        if index < len(self._buckets):
            self._buckets[index](1)
