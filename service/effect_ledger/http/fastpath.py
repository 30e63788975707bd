"""The four executor calls (claim, submit, heartbeat, complete) served before Litestar's routing.

Executors send these calls all day, and a flooding tenant sends nothing else, so they skip the
framework: the path is matched by one split, the bearer token is checked against the verifier's
cache, the scope and the rate limit are decided *before* any routing or body reading (a 401, 403 or
429 costs tens of microseconds), the body is decoded strictly into the same msgspec struct, and the
same functions as the routed handlers (http.executor.run_*) build the same answer, encoded by msgspec.

Everything unusual goes to Litestar unchanged, as if this module did not exist: another method or
path, an operation ID the route would refuse, a body that is not JSON, is empty, too large, or does
not decode into its struct (Litestar's handlers then answer with the exact problem they always gave;
the body already read is replayed to them, and the caller already admitted is not charged a second
rate-limit token). Failures other than a LedgerError (the database unavailable, a bug) are answered
by the app's own exception handlers, so their incidents are recorded as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from litestar import Request
from litestar.types import ASGIApp, Receive, Scope, Send

from effect_ledger.db.ledger import Ledger
from effect_ledger.domain.errors import LedgerError
from effect_ledger.http.auth import ADMITTED_KEY, CALLER_KEY, EXECUTE, admit, paced
from effect_ledger.http.context import refuse_while_state_log_behind
from effect_ledger.http.executor import (
    OPERATION_PATH,
    Reply,
    run_claim,
    run_complete,
    run_heartbeat,
    run_submit,
)
from effect_ledger.http.problems import EXCEPTION_HANDLERS, problem_body, problem_headers
from effect_ledger.http.schemas import OPERATION_ID, ClaimBody, CompleteBody, HeartbeatBody, SubmitBody
from effect_ledger.http.telemetry import EXCHANGE_KEY, PROBLEM_CODE_KEY, ROUTE_KEY, Exchange

PREFIX = "/v1/operations/"
_JSON = (b"content-type", b"application/json")
_PROBLEM = (b"content-type", b"application/problem+json")
_ENCODE = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class Route:
    """One executor call: its template, its body type and the function that answers it."""

    template: str
    body: type[msgspec.Struct]
    run: Callable[[Any, Ledger, Any, str, Any], Awaitable[Reply]]
    decode: Callable[[bytes], Any] = field(init=False)  # the body's strict decoder, built once

    def __post_init__(self) -> None:
        object.__setattr__(self, "decode", msgspec.json.Decoder(self.body).decode)


_TEMPLATE = OPERATION_PATH.replace("{operation_id:str}", "{operation_id}")
ROUTES = {
    "claim": Route(f"{_TEMPLATE}/claim", ClaimBody, run_claim),
    "submit": Route(f"{_TEMPLATE}/submit", SubmitBody, run_submit),
    "heartbeat": Route(f"{_TEMPLATE}/heartbeat", HeartbeatBody, run_heartbeat),
    "complete": Route(f"{_TEMPLATE}/complete", CompleteBody, run_complete),
}


def match(scope: Scope) -> tuple[Route, str] | None:
    """The executor route and operation ID of a request, when it is one this module serves."""
    if scope["type"] != "http" or scope.get("method") != "POST":  # type: ignore[comparison-overlap]
        return None
    path: str = scope["path"]
    if not path.startswith(PREFIX):
        return None
    operation_id, _, call = path[len(PREFIX) :].rpartition("/")
    route = ROUTES.get(call)
    if route is None or OPERATION_ID.match(operation_id) is None:
        return None
    return route, operation_id


async def send_json(
    scope: Scope, send: Send, status: int, content: Any, headers: list[tuple[bytes, bytes]]
) -> None:
    """One JSON answer: the two ASGI messages, headers as Litestar writes them (lower-case names);
    through the request's Exchange (http.telemetry) when there is one, which adds the request ID."""
    await send_encoded(scope, send, status, _ENCODE(content), headers)


async def send_encoded(
    scope: Scope, send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    """send_json's answer for a body already encoded."""
    exchange: Exchange | None = scope.get(EXCHANGE_KEY)  # type: ignore[assignment]  # set by RequestTelemetry
    if exchange is not None:
        await exchange.answer(status, headers, body)
        return
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_problem(scope: Scope, send: Send, error: LedgerError) -> None:
    """The problem+json answer of `error`, exactly as http.problems.problem_response builds it. A
    refusal without extensions (401, 403, 429: a flood's answers) is one of few texts: its headers
    and body are built once per worker (by code, detail and Retry-After; the code fixes title and
    status)."""
    if error.extensions:
        headers = [(_header_name(k), v.encode("latin-1")) for k, v in problem_headers(error).items()]
        headers.append(_PROBLEM)
        await send_json(scope, send, error.status, problem_body(error), headers)
        return
    key = (error.code, error.detail, error.retry_after)
    built = _PLAIN_PROBLEMS.get(key)
    if built is None:
        names = [(_header_name(k), v.encode("latin-1")) for k, v in problem_headers(error).items()]
        built = (tuple((*names, _PROBLEM)), _ENCODE(problem_body(error)))
        if len(_PLAIN_PROBLEMS) < 256:  # codes and details are the service's own; retry-afters few
            _PLAIN_PROBLEMS[key] = built
    await send_encoded(scope, send, error.status, built[1], list(built[0]))


_PLAIN_PROBLEMS: dict[tuple[Any, ...], tuple[tuple[tuple[bytes, bytes], ...], bytes]] = {}


# Header names as Litestar writes them (lower-case bytes); the few the executor calls use, kept.
_HEADER_NAMES: dict[str, bytes] = {}


def _header_name(name: str) -> bytes:
    encoded = _HEADER_NAMES.get(name)
    if encoded is None:
        encoded = name.lower().encode("latin-1")
        if len(_HEADER_NAMES) < 64:  # the service's own names; bounded all the same
            _HEADER_NAMES[name] = encoded
    return encoded


def _replaying(chunks: list[bytes], more: bool, receive: Receive) -> Receive:
    """A receive that gives back the body already read, then (if there was more) the rest."""
    pending = list(chunks)

    async def replay() -> Any:
        if pending:
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending) or more}
        if not more and not chunks:
            return {"type": "http.request", "body": b"", "more_body": False}
        return await receive()

    return replay


class ExecutorFastPath:
    """ASGI wrapper serving the executor calls directly; everything else goes to `app` (Litestar)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = match(scope)
        if found is None:
            await self.app(scope, receive, send)
            return
        route, operation_id = found
        state = scope["app"].state
        scope["path_params"] = {"operation_id": operation_id}
        scope[ROUTE_KEY] = route.template  # type: ignore[literal-required]
        try:
            caller = admit(scope, state, (EXECUTE,))
        except LedgerError as refused:  # 401, 403, 429: before the body is read or anything routed
            scope[PROBLEM_CODE_KEY] = refused.code  # type: ignore[literal-required]  # the summary line's code
            await send_problem(scope, send, await paced(scope, state, refused))  # a flood's 429 is held first
            return
        scope[ADMITTED_KEY] = True  # type: ignore[literal-required]  # the guards do not charge again
        chunks, more = await self._read(scope, receive)
        data = None if more else self._decode(chunks, route)
        if data is None:  # not the plain case: Litestar answers it, exactly as before
            await self.app(scope, _replaying(chunks, more, receive), send)
            return
        try:
            refuse_while_state_log_behind(state)  # as writing_ledger_of does on the routed path
            reply = await route.run(state, state.ledger, caller, operation_id, data)
        except LedgerError as error:
            scope[PROBLEM_CODE_KEY] = error.code  # type: ignore[literal-required]
            await send_problem(scope, send, error)
            return
        except Exception as exc:  # the app's handlers record the incident
            await self._fail(scope, receive, send, exc)
            return
        extra = reply.headers
        headers = [(_header_name(k), v.encode("latin-1")) for k, v in extra.items()] if extra else []
        headers.append(_JSON)
        await send_json(scope, send, reply.status, reply.content, headers)

    async def _read(self, scope: Scope, receive: Receive) -> tuple[list[bytes], bool]:
        """The body's chunks; `more` when it stopped early (over the limit, or a disconnect)."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return chunks, True
            chunk = message.get("body", b"")
            if chunk:
                chunks.append(chunk)
                size += len(chunk)
            if not message.get("more_body", False):
                return chunks, False
            if size > self.max_body_bytes:
                return chunks, True

    def _decode(self, chunks: list[bytes], route: Route) -> Any:
        """The strictly decoded body, or None for anything Litestar should answer (see the module doc)."""
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if not body or len(body) > self.max_body_bytes:
            return None
        try:
            return route.decode(body)
        except (msgspec.DecodeError, RecursionError):
            return None

    async def _fail(self, scope: Scope, receive: Receive, send: Send, exc: Exception) -> None:
        """An unexpected failure, answered by the app's own exception handler for it."""
        scope["path_template"] = scope[ROUTE_KEY]  # type: ignore[literal-required]  # the incident's route
        request: Request[Any, Any, Any] = Request(scope, receive)
        handler = next(h for kind, h in EXCEPTION_HANDLERS.items() if isinstance(exc, kind))
        response = handler(request, exc)
        await response.to_asgi_response(app=None, request=request)(scope, receive, send)


__all__ = ["CALLER_KEY", "ROUTES", "ExecutorFastPath", "match"]
