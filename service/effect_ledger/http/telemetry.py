"""Per request: an X-Request-ID, one JSON summary line, and the latency histogram.

RequestTelemetry wraps the whole Litestar ASGI handler (outside routing and the exception
handlers), so 404s, 405s and problem answers get the header and the log line as well.
"""

from __future__ import annotations

import contextvars
import logging
import os
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec
import structlog
from litestar.types import ASGIApp, Message, Receive, Scope, Send

from effect_ledger import tracing
from effect_ledger.domain.errors import PROBLEMS, LedgerError
from effect_ledger.domain.model import EventDraft
from effect_ledger.http.metrics import ATTEMPT_KINDS, CLAIM_RESULTS, METHODS, Metrics
from effect_ledger.http.pacing import REPEATED_KEY
from effect_ledger.http.problems import PROBLEM_JSON, problem_body
from effect_ledger.logs import summary_enabled, write_summary

REQUEST_ID_HEADER = b"x-request-id"
_REQUEST_ID_LENGTH = len(REQUEST_ID_HEADER)
# A caller's request ID is kept only if it is short and harmless to log and to echo in a header.
_SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@+=/-]{1,128}")
# Probes and scrapes come every few seconds: their lines are debug, unless they fail.
QUIET_ROUTES = frozenset({"/livez", "/readyz", "/metrics"})
UNMATCHED = "unmatched"
ROUTE_KEY = "effect_ledger.route"  # the template of a route served before routing (http.fastpath)
PROBLEM_CODE_KEY = "effect_ledger.problem_code"  # the code of a problem answered before routing
EXCHANGE_KEY = "effect_ledger.exchange"  # the request's Exchange (http.fastpath answers through it)
_MAX_OPERATION_ID = 200
_MAX_PROBLEM_BYTES = 64 * 1024

log = structlog.get_logger("effect_ledger.http")


class _Problem(msgspec.Struct):
    code: str | None = None


def request_id_from(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The caller's X-Request-ID when it is safe, else a new one."""
    return request_id_chosen(headers)[0]


def request_id_chosen(headers: Iterable[tuple[bytes, bytes]]) -> tuple[str, bool]:
    """request_id_from's ID, and True when the caller chose it (its text is then screened in logs)."""
    for name, value in headers:
        if len(name) == _REQUEST_ID_LENGTH and name.lower() == REQUEST_ID_HEADER:
            text = value.decode("latin-1")
            if _SAFE_REQUEST_ID.fullmatch(text):
                return text, True
            break
    return os.urandom(16).hex(), False  # 32 hex digits (secrets.token_hex(16)), without building a UUID


class Exchange:
    """One request's answer as the summary line needs it (status, problem code source, end time), and
    the two ways to send it: `send`, the wrapper every ASGI answer goes through (it adds the request ID
    header), and `answer`, for an answer the service builds itself (http.fastpath), which passes the
    same two messages on without looking them over again."""

    __slots__ = ("_send", "body", "finished", "header", "problem", "status")

    def __init__(self, send: Send, header: tuple[bytes, bytes]) -> None:
        self._send = send
        self.header = header  # (x-request-id, the request's ID)
        self.status: int | None = None
        self.problem = False
        self.body = b""
        self.finished: float | None = None

    async def send(self, message: Message) -> None:
        """Pass an ASGI message on: the request ID header replaces any other; a problem's body is kept
        (bounded) for its code; the answer's end is the moment its last body message is sent."""
        if message["type"] == "http.response.start":
            headers = []
            for name, value in message.get("headers", ()):
                lowered = name.lower()
                if lowered == REQUEST_ID_HEADER:
                    continue  # ours replaces any other
                if lowered == b"content-type":
                    self.problem = value.startswith(_PROBLEM_TYPE)
                headers.append((name, value))
            headers.append(self.header)
            self.status = message["status"]
            message = {**message, "headers": headers}
        elif message["type"] == "http.response.body":
            if self.problem and len(self.body) < _MAX_PROBLEM_BYTES:
                self.body += message.get("body", b"")
            if not message.get("more_body", False):
                self.finished = time.perf_counter()
        await self._send(message)

    async def answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """A whole answer built by the service: `headers` (lower-case names, no content-length, no
        request ID) then `body`, as the two messages `send` would have passed on. A problem answer's
        code is in the scope (PROBLEM_CODE_KEY), so its body is not kept."""
        headers.append((b"content-length", str(len(body)).encode()))
        headers.append(self.header)
        self.status = status
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        self.finished = time.perf_counter()
        await self._send({"type": "http.response.body", "body": body, "more_body": False})


def _context_var(key: str) -> contextvars.ContextVar[Any]:
    """The ContextVar structlog binds `key` in (bind_contextvars creates it once and keeps it): set
    directly, a request's bindings cost a C call instead of structlog's loop over keywords."""
    token = structlog.contextvars.bind_contextvars(**{key: Ellipsis})[key]
    token.var.reset(token)
    return token.var


_REQUEST_ID_VAR = _context_var("request_id")
_OUTCOME_VAR = _context_var("outcome")
# Every ContextVar structlog ever made, by key (it only grows). While it holds just the two above, the
# bound context is exactly them, so the summary line needs no walk over the whole context
# (get_contextvars copies it and tests every variable's name); anything else bound takes that walk.
_STRUCTLOG_VARS: dict[str, contextvars.ContextVar[Any]] = getattr(
    structlog.contextvars, "_CONTEXT_VARS", {"": _REQUEST_ID_VAR, " ": _OUTCOME_VAR, "  ": _OUTCOME_VAR}
)


class LedgerTelemetry:
    """The ledger's observer: counts into the metrics and names the outcome in the request's log line."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def observe(self, call: str, outcome: str, events: Sequence[EventDraft]) -> None:
        """Count the decision; name `outcome` in the request's summary line and its span."""
        self.metrics.observe(call, outcome, events)
        category = CLAIM_RESULTS.get(outcome, outcome) if call == "claim" else outcome
        _OUTCOME_VAR.set(category)  # structlog.contextvars.bind_contextvars(outcome=category), directly
        if tracing.active():
            tracing.annotate_current(span_facts(call, outcome, category, events))


# What the caller may now know about the effect (the seed's "effect knowledge"), by status or verdict.
EFFECT_KNOWLEDGE = {
    "pending": "none",
    "not_applied": "none",
    "created": "none",
    "new_attempt": "none",
    "replay": "none",
    "submitted": "unknown",
    "unknown": "unknown",
    "outcome_unknown": "unknown",
    "committed": "committed",
    "reuse_receipt": "committed",
}


def span_facts(call: str, outcome: str, category: str, events: Sequence[EventDraft]) -> dict[str, str | int]:
    """The telemetry contract's attributes of one ledger decision: bounded values, no tenant data."""
    facts: dict[str, str | int] = {"effect_ledger.call": call, "effect_ledger.outcome": category}
    if call == "claim" and category in ATTEMPT_KINDS:
        facts["effect_ledger.attempt_kind"] = ATTEMPT_KINDS[category]
    knowledge = EFFECT_KNOWLEDGE.get(outcome)
    if knowledge is not None:
        facts["effect_ledger.effect_knowledge"] = knowledge
    attempts = [event.attempt for event in events]
    if attempts:
        facts["effect_ledger.operation.attempt"] = max(attempts)
    return facts


class RequestTelemetry:
    """ASGI wrapper: request ID in and out, duration, one `request` log line, the latency histogram.

    One pass per request, everything per-worker prepared up front: the request ID header is appended
    to the answer's start message in place, the histogram series is looked up once per worker
    (Metrics.observe_request), and the summary line is one dict written by logs.write_summary, with
    only its caller-supplied values redacted. Spans are built only when tracing is on.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # type: ignore[comparison-overlap]  # lifespan never gets here
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id, chosen = request_id_chosen(scope["headers"])
        exchange = Exchange(send, (REQUEST_ID_HEADER, request_id.encode("latin-1")))
        scope[EXCHANGE_KEY] = exchange  # type: ignore[literal-required]  # for answers the service builds
        # outcome=None first, so that the value a handler binds is reset with request_id afterwards
        # (structlog's bind_contextvars / reset_contextvars, on its own variables).
        request_id_token = _REQUEST_ID_VAR.set(request_id)
        outcome_token = _OUTCOME_VAR.set(None)
        try:
            if tracing.active():
                method = str(scope.get("method", ""))
                method = method if method in METHODS else "other"
                with tracing.server_span(method, _trace_headers(scope)) as span:
                    await self._run(scope, receive, exchange.send, exchange)
                    self._summarise(scope, exchange, started, span, request_id, chosen)
            else:
                await self._run(scope, receive, exchange.send, exchange)
                self._summarise(scope, exchange, started, None, request_id, chosen)
        finally:
            _OUTCOME_VAR.reset(outcome_token)
            _REQUEST_ID_VAR.reset(request_id_token)

    async def _run(self, scope: Scope, receive: Receive, send: Send, exchange: Exchange) -> None:
        try:
            await self.app(scope, receive, send)
        except Exception as exc:
            if exchange.status is not None:
                raise
            # Exception handlers answer everything; this is the last resort if one of them fails.
            log.error("unhandled_exception", exception_type=type(exc).__name__)
            await _send_internal_error(send)

    def _summarise(
        self,
        scope: Scope,
        exchange: Exchange,
        started: float,
        span: tracing.Span,
        request_id: str,
        chosen: bool,
    ) -> None:
        ended = exchange.finished or time.perf_counter()
        status = exchange.status or 500
        route = _route_of(scope)
        method = str(scope.get("method", ""))
        self.metrics.observe_request(route, method, status, ended - started)
        code = scope.get(PROBLEM_CODE_KEY) or (_problem_code(exchange) if exchange.problem else None)
        if span is not None:
            span.update_name(f"{method if method in METHODS else 'other'} {route}")
            facts: dict[str, str | int] = {"http.route": route, "http.response.status_code": status}
            if code is not None and code in PROBLEMS:
                facts["effect_ledger.refusal_code"] = code
            tracing.set_attributes(span, facts)
        # probes and scrapes, and a refused caller's repeated 429s (http.pacing), at debug
        quiet = (route in QUIET_ROUTES and status < 500) or REPEATED_KEY in scope
        level = logging.DEBUG if quiet else logging.INFO
        if not summary_enabled(level):
            return
        caller = scope.get("effect_ledger.caller")  # set by the auth guard, if the route had one
        if len(_STRUCTLOG_VARS) <= 2:  # only ours (request_id, outcome): both are fields of the line
            context: dict[str, Any] = {}
            outcome = _OUTCOME_VAR.get()
        else:  # something else bound structlog context: the line carries it too
            context = structlog.contextvars.get_contextvars()
            outcome = context.get("outcome")
        write_summary(
            level,
            "request",
            {
                "request_id": request_id,
                "outcome": outcome,  # a bounded category (LedgerTelemetry)
                "route": route,
                "method": method,
                "status": status,
                "code": code,
                "tenant": getattr(caller, "tenant", None),
                "principal": getattr(caller, "principal", None),
                "operation_id": _operation_id(scope),
                "duration_ms": round((ended - started) * 1000, 3),
            },
            _UNTRUSTED_WITH_ID if chosen else _UNTRUSTED,
            context,
        )


# Caller text in a summary line (the request ID too, when the caller chose it); the rest is controlled.
_UNTRUSTED = ("method", "tenant", "principal", "operation_id")
_UNTRUSTED_WITH_ID = (*_UNTRUSTED, "request_id")
_PROBLEM_TYPE = PROBLEM_JSON.encode()


def _trace_headers(scope: Scope) -> dict[str, str]:
    """Only the W3C trace context headers: nothing else of the request reaches the tracer."""
    return {
        name.decode("latin-1").lower(): value.decode("latin-1")
        for name, value in scope["headers"]
        if name.lower() in (b"traceparent", b"tracestate")
    }


def _route_of(scope: Scope) -> str:
    """The matched route's template ("/v1/operations/{operation_id}/claim"), never the concrete path."""
    served = scope.get(ROUTE_KEY)  # http.fastpath names its template itself
    if served is not None and scope.get("route_handler") is None:
        return str(served)
    handler = scope.get("route_handler")
    template = scope.get("path_template")
    if handler is None or not template:
        return UNMATCHED
    return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", str(template))


def _operation_id(scope: Scope) -> str | None:
    value = (scope.get("path_params") or {}).get("operation_id")
    return value[:_MAX_OPERATION_ID] if isinstance(value, str) else None


def _problem_code(exchange: Exchange) -> str | None:
    try:
        return msgspec.json.decode(exchange.body, type=_Problem).code
    except msgspec.DecodeError:
        return None


async def _send_internal_error(send: Send) -> None:
    body = msgspec.json.encode(problem_body(LedgerError("internal", "An internal error occurred.")))
    await send(
        {
            "type": "http.response.start",
            "status": 500,
            "headers": [
                (b"content-type", PROBLEM_JSON.encode()),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
